// Command gen compiles airlock's .proto files (proto/envd) without protoc and
// runs the pinned protoc-gen-go and protoc-gen-connect-go plugins on them,
// writing the Go code under internal/plane/e2b/envd.
//
// It is its own module so that the compiler it needs stays out of airlock's
// go.mod. Run it from the repository root:
//
//	cd proto/gen && go run . -root ../..
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

// The plugins, pinned to the versions of airlock's go.mod.
var plugins = []string{
	"google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12",
	"connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1",
}

// files are the .proto files to generate, relative to proto/.
var files = []string{"envd/process.proto", "envd/filesystem.proto"}

func main() {
	root := flag.String("root", "../..", "repository root")
	flag.Parse()
	if err := run(*root); err != nil {
		log.Fatal(err)
	}
}

func run(root string) error {
	comp := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			ImportPaths: []string{filepath.Join(root, "proto")},
		}),
		SourceInfoMode: protocompile.SourceInfoStandard,
	}
	res, err := comp.Compile(context.Background(), files...)
	if err != nil {
		return fmt.Errorf("compiling: %w", err)
	}
	// The request holds every file the targets import, dependencies first.
	var all []*descriptorpb.FileDescriptorProto
	seen := map[string]bool{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imps := fd.Imports()
		for i := 0; i < imps.Len(); i++ {
			add(imps.Get(i).FileDescriptor)
		}
		all = append(all, protodesc.ToFileDescriptorProto(fd))
	}
	for _, f := range res {
		add(f)
	}
	req := &pluginpb.CodeGeneratorRequest{
		FileToGenerate: files,
		Parameter:      proto.String("paths=import"),
		ProtoFile:      all,
		CompilerVersion: &pluginpb.Version{Major: proto.Int32(0), Minor: proto.Int32(14), Patch: proto.Int32(1),
			Suffix: proto.String("protocompile")},
	}
	in, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	const modPrefix = "github.com/airlockhq/airlock/"
	for _, p := range plugins {
		cmd := exec.Command("go", "run", p)
		cmd.Stdin, cmd.Stderr = bytes.NewReader(in), os.Stderr
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("running %s: %w", p, err)
		}
		var resp pluginpb.CodeGeneratorResponse
		if err := proto.Unmarshal(out, &resp); err != nil {
			return fmt.Errorf("%s response: %w", p, err)
		}
		if resp.Error != nil {
			return fmt.Errorf("%s: %s", p, resp.GetError())
		}
		for _, f := range resp.File {
			name := f.GetName()
			if !strings.HasPrefix(name, modPrefix) {
				return fmt.Errorf("%s: unexpected output path %s", p, name)
			}
			dst := filepath.Join(root, strings.TrimPrefix(name, modPrefix))
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(dst, []byte(f.GetContent()), 0o644); err != nil {
				return err
			}
			fmt.Println("wrote", dst)
		}
	}
	return nil
}
