package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// A sandbox's life: create, run a command, copy a file in, delete.
func Example() {
	ctx := context.Background()
	c, err := client.New("", "", client.FromEnv()) // AIRLOCK_URL, AIRLOCK_API_KEY
	if err != nil {
		log.Fatal(err)
	}
	sbx, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Metadata: map[string]string{"user": "u-42"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSandbox(context.WithoutCancel(ctx), sbx.ID)

	if _, err := c.WriteFile(ctx, sbx.ID, "/home/user/task.py", strings.NewReader("print(6*7)\n")); err != nil {
		log.Fatal(err)
	}
	res, err := c.Exec(ctx, sbx.ID, api.ExecRequest{Cmd: []string{"python3", "/home/user/task.py"}})
	if err != nil {
		log.Fatal(err)
	}
	stdout, _, _ := client.Output(res)
	fmt.Printf("%s exit %d: %s", res.Status, *res.ExitCode, stdout)
}

// Streaming output as it happens; a dropped connection resumes by itself.
func ExampleClient_ExecStream() {
	ctx := context.Background()
	c, _ := client.New("", "", client.FromEnv())
	shell := "for i in 1 2 3; do echo $i; sleep 1; done"
	for ev, err := range c.ExecStream(ctx, "sbx_…", api.ExecRequest{Shell: &shell}) {
		if err != nil {
			log.Fatal(err)
		}
		switch ev.Type {
		case client.EventStdout:
			os.Stdout.Write(ev.Data)
		case client.EventStderr:
			os.Stderr.Write(ev.Data)
		case client.EventExit:
			fmt.Println("status:", ev.Result.Status)
		}
	}
}

// Errors carry the API's code; classes match with errors.Is, and busy
// servers say when to come back.
func ExampleAPIError() {
	ctx := context.Background()
	c, _ := client.New("", "", client.FromEnv())
	for {
		_, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
		if wait, ok := client.RetryAfter(err); ok && errors.Is(err, client.ErrCapacityExhausted) {
			time.Sleep(max(wait, time.Second))
			continue
		}
		var ae *client.APIError
		if errors.As(err, &ae) {
			log.Printf("%s (code %s, request %s)", ae.Message, ae.Code, ae.RequestID)
		}
		return
	}
}

// The Sandbox handle: create from the environment, run a command streaming
// its output, read a file the command wrote, always delete.
func ExampleCreate() {
	ctx := context.Background()
	sbx, err := client.Create(ctx, client.WithTemplate("base"), client.WithTTL(5*time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	defer sbx.Close()

	res, err := sbx.Run(ctx, "python3 -c 'print(6*7)' | tee out.txt", client.WithTimeout(30*time.Second),
		client.OnStdout(func(s string) { fmt.Print(s) }))
	if errors.Is(err, client.ErrExecTimeout) {
		log.Fatal("timed out")
	}
	if err != nil {
		log.Fatal(err)
	}
	if res.ExitCode != 0 {
		log.Fatalf("exit %d: %s", res.ExitCode, res.Stderr)
	}
	b, err := sbx.Files().Read(ctx, "out.txt") // /home/user/out.txt
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("file: %s", b)
}

// Typed errors: the class with errors.Is, the details with errors.As.
func ExampleSandbox_errors() {
	ctx := context.Background()
	sbx, err := client.Create(ctx, client.WithTemplate("python"))
	var apiErr *client.APIError
	switch {
	case errors.Is(err, client.ErrQuotaExceeded) && errors.As(err, &apiErr):
		fmt.Println("over quota; retry in", apiErr.RetryAfter)
		return
	case err != nil:
		log.Fatal(err)
	}
	defer sbx.Close()
	cmd, err := sbx.Start(ctx, "python3 -m http.server 8000")
	if err != nil {
		log.Fatal(err)
	}
	defer cmd.Kill(ctx)
}
