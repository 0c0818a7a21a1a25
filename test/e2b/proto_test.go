package e2btest

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	_ "github.com/airlockhq/airlock/internal/plane/e2b/envd/filesystempb"
	_ "github.com/airlockhq/airlock/internal/plane/e2b/envd/processpb"
)

// fileDescRE finds the serialized descriptors the SDK bundles (protobuf-es
// `fileDesc("…")`).
var fileDescRE = regexp.MustCompile(`fileDesc\)?\("([A-Za-z0-9+/=]+)"`)

// TestProtoMatchesSDK checks our own .proto files (proto/envd) against the
// descriptors bundled in the pinned SDK: every message, field (name,
// number, type, cardinality, oneof) and method the SDK knows must be ours
// too, or the JSON and binary encodings would silently disagree.
func TestProtoMatchesSDK(t *testing.T) {
	dir := nodeModules(t)
	src, err := os.ReadFile(filepath.Join(dir, "node_modules", "e2b", "dist", "index.js"))
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, m := range fileDescRE.FindAllStringSubmatch(string(src), -1) {
		b, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(m[1], "="))
		if err != nil {
			t.Fatalf("decoding a bundled descriptor: %v", err)
		}
		var fd descriptorpb.FileDescriptorProto
		if err := proto.Unmarshal(b, &fd); err != nil {
			t.Fatalf("parsing a bundled descriptor: %v", err)
		}
		if fd.GetPackage() != "process" && fd.GetPackage() != "filesystem" {
			continue
		}
		found[fd.GetPackage()] = true
		t.Run(fd.GetPackage(), func(t *testing.T) {
			for _, msg := range fd.GetMessageType() {
				checkMessage(t, fd.GetPackage()+"."+msg.GetName(), msg)
			}
			for _, svc := range fd.GetService() {
				checkService(t, fd.GetPackage()+"."+svc.GetName(), svc)
			}
		})
	}
	if !found["process"] || !found["filesystem"] {
		t.Fatalf("the SDK bundle has no process/filesystem descriptors (found %v): has its layout changed?", found)
	}
}

func lookup(t *testing.T, name string) protoreflect.Descriptor {
	t.Helper()
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
	if err != nil {
		t.Errorf("%s: the SDK has it, proto/envd does not", name)
		return nil
	}
	return d
}

func checkMessage(t *testing.T, name string, want *descriptorpb.DescriptorProto) {
	t.Helper()
	d := lookup(t, name)
	if d == nil {
		return
	}
	md, ok := d.(protoreflect.MessageDescriptor)
	if !ok {
		t.Errorf("%s: not a message in proto/envd", name)
		return
	}
	for _, f := range want.GetField() {
		got := md.Fields().ByName(protoreflect.Name(f.GetName()))
		if got == nil {
			t.Errorf("%s.%s: missing in proto/envd", name, f.GetName())
			continue
		}
		if int32(got.Number()) != f.GetNumber() {
			t.Errorf("%s.%s: number %d, SDK %d", name, f.GetName(), got.Number(), f.GetNumber())
		}
		if int32(got.Kind()) != int32(f.GetType()) {
			t.Errorf("%s.%s: type %v, SDK %v", name, f.GetName(), got.Kind(), f.GetType())
		}
		if (f.GetLabel() == descriptorpb.FieldDescriptorProto_LABEL_REPEATED) != (got.Cardinality() == protoreflect.Repeated) {
			t.Errorf("%s.%s: repeated differs from the SDK", name, f.GetName())
		}
		if tn := strings.TrimPrefix(f.GetTypeName(), "."); tn != "" {
			var gotName protoreflect.FullName
			if got.Message() != nil {
				gotName = got.Message().FullName()
			} else if got.Enum() != nil {
				gotName = got.Enum().FullName()
			}
			if string(gotName) != tn {
				t.Errorf("%s.%s: type %s, SDK %s", name, f.GetName(), gotName, tn)
			}
		}
		inOneof := f.OneofIndex != nil && !f.GetProto3Optional()
		if inOneof != (got.ContainingOneof() != nil && !got.ContainingOneof().IsSynthetic()) {
			t.Errorf("%s.%s: oneof membership differs from the SDK", name, f.GetName())
		}
	}
	for _, nested := range want.GetNestedType() {
		if nested.GetOptions().GetMapEntry() {
			continue
		}
		checkMessage(t, name+"."+nested.GetName(), nested)
	}
	for _, e := range want.GetEnumType() {
		checkEnum(t, name+"."+e.GetName(), e)
	}
}

func checkEnum(t *testing.T, name string, want *descriptorpb.EnumDescriptorProto) {
	t.Helper()
	d := lookup(t, name)
	ed, ok := d.(protoreflect.EnumDescriptor)
	if !ok {
		return
	}
	for _, v := range want.GetValue() {
		got := ed.Values().ByName(protoreflect.Name(v.GetName()))
		if got == nil || int32(got.Number()) != v.GetNumber() {
			t.Errorf("%s.%s: missing or renumbered in proto/envd", name, v.GetName())
		}
	}
}

func checkService(t *testing.T, name string, want *descriptorpb.ServiceDescriptorProto) {
	t.Helper()
	d := lookup(t, name)
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return
	}
	for _, m := range want.GetMethod() {
		got := sd.Methods().ByName(protoreflect.Name(m.GetName()))
		if got == nil {
			t.Errorf("%s/%s: missing in proto/envd", name, m.GetName())
			continue
		}
		if got.IsStreamingClient() != m.GetClientStreaming() || got.IsStreamingServer() != m.GetServerStreaming() ||
			string(got.Input().FullName()) != strings.TrimPrefix(m.GetInputType(), ".") ||
			string(got.Output().FullName()) != strings.TrimPrefix(m.GetOutputType(), ".") {
			t.Errorf("%s/%s: signature differs from the SDK", name, m.GetName())
		}
	}
}
