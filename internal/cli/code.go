package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/lazyregexp"
)

// maxCLICode bounds code read from a file or stdin (the server's limit is
// 1 MiB as well).
const maxCLICode = 1 << 20

// sandboxIDRE recognises a sandbox id given as the first argument of
// `airlock code` (a cell that is only such a name would do nothing).
var sandboxIDRE = lazyregexp.New(`^sbx_[a-z0-9]{1,64}$`)

func (a *app) newCodeCmd() *cobra.Command {
	var (
		contextID, language, file, saveDir string
		sandboxID, template                string
		timeout                            float64
		jsonOut                            bool
	)
	cmd := &cobra.Command{
		Use:         "code [SANDBOX] [CODE]",
		Annotations: map[string]string{sandboxRunner: "true"},
		Short:       "Run a code-interpreter cell (python, javascript, bash)",
		Long: `Run a cell in a stateful code-interpreter context of a sandbox: variables,
imports and the working directory persist between calls. Without --context
the cell runs in the sandbox's default context of --language.

The sandbox is SANDBOX, or --sandbox, or $AIRLOCK_SANDBOX; with none, a
sandbox of --template (code-interpreter) is created for this one cell and
deleted after it (its state goes with it).

The code is CODE, or the file given with -f, or stdin when CODE is "-" or
missing. stdout and stderr are streamed; the value of the last expression
is printed; images (PNG, JPEG, SVG) are saved to --save-dir when given (made
if missing), as result-N.png and so on, N numbered on from the files already
there: nothing is overwritten. With --json every event is printed as one
JSON line as it comes; with -o json the cell's outcome (stdout, stderr,
results, error, execution_count) as one JSON object once it ended.

A code-interpreter template that is being built (its first use builds it,
for a few minutes) is waited for, its build's log shown on stderr.

Exit status: 0, or 1 when the cell raised an error; 125 when airlock failed
(an API error, no server, an image that could not be saved), 130 when
interrupted.`,
		Example: `  airlock code 'print(1)'                      # a one-off sandbox
  airlock code sbx_… 'import math; math.pi'
  airlock code --sandbox sbx_… --context ctx_… 'x + 1'
  airlock code --language javascript sbx_… '[1,2,3].map(x => x*2)'
  airlock code sbx_… -f analysis.py --save-dir ./charts
  echo 'ls | wc -l' | airlock code --language bash sbx_…`,
		Args: cobra.RangeArgs(0, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if sandboxID == "" {
				sandboxID = a.getenv("AIRLOCK_SANDBOX")
			}
			codeArg := ""
			switch {
			case len(args) == 2 && cmd.Flags().Changed("sandbox"):
				return usagef("give the sandbox as an argument or with --sandbox, not both")
			case len(args) == 2:
				sandboxID, codeArg = args[0], args[1]
			case len(args) == 1 && sandboxIDRE.MatchString(args[0]) && !cmd.Flags().Changed("sandbox"):
				sandboxID = args[0]
			case len(args) == 1:
				codeArg = args[0]
			}
			code, err := a.codeSource(codeArg, file)
			if err != nil {
				return err
			}
			var saver *imageSaver
			if saveDir != "" {
				// Before anything runs: a directory that cannot be made
				// fails the command, not each image silently.
				if saver, err = newImageSaver(saveDir); err != nil {
					return err
				}
			}
			req := api.CodeRequest{Code: code, Language: language}
			if contextID != "" {
				req.ContextID = &contextID
			}
			if cmd.Flags().Changed("timeout") {
				req.TimeoutS = &timeout
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if sandboxID == "" {
				sbx, aborted, err := a.createCodeSandbox(cmd.Context(), c, template)
				if sbx != nil {
					defer a.deleteQuietly(cmd.Context(), c, sbx.ID)
				}
				if err != nil {
					return err
				}
				if aborted {
					return exitCodeError{exitInterrupted}
				}
				sandboxID = sbx.ID
			}
			if a.output == "json" && !jsonOut {
				// One object once the cell ended, as exec -o json.
				ex, err := c.RunCode(cmd.Context(), sandboxID, req, nil)
				if err != nil {
					return err
				}
				if ex.Results == nil {
					ex.Results = []api.CodeEvent{}
				}
				if err := printJSON(a.stdout, ex); err != nil {
					return err
				}
				if ex.Error != nil {
					return exitCodeError{1}
				}
				return nil
			}
			failed := false
			var saveErr error
			for ev, err := range c.RunCodeStream(cmd.Context(), sandboxID, req) {
				if err != nil {
					return err
				}
				if jsonOut {
					b, _ := json.Marshal(ev)
					fmt.Fprintf(a.stdout, "%s\n", b)
					if ev.Type == api.CodeEventError {
						failed = true
					}
					continue
				}
				switch ev.Type {
				case api.CodeEventStdout:
					io.WriteString(a.stdout, ev.Text)
				case api.CodeEventStderr:
					io.WriteString(a.stderr, ev.Text)
				case api.CodeEventResult:
					if err := a.saveImages(ev, saver); err != nil && saveErr == nil {
						saveErr = err
					}
					if ev.Text != "" {
						fmt.Fprintln(a.stdout, ev.Text)
					}
				case api.CodeEventError:
					failed = true
					if ev.Traceback != "" {
						fmt.Fprintln(a.stderr, ev.Traceback)
					} else {
						fmt.Fprintf(a.stderr, "%s: %s\n", ev.Name, ev.Value)
					}
				}
			}
			if saveErr != nil {
				return saveErr
			}
			if failed {
				return exitCodeError{1}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&contextID, "context", "", "context id (default: the sandbox's default context of --language)")
	fl.StringVarP(&language, "language", "l", "", "python (default), javascript or bash")
	fl.StringVarP(&file, "file", "f", "", "read the code from this file")
	fl.Float64Var(&timeout, "timeout", 0, "seconds before the cell is interrupted (default: the server's, 300)")
	fl.StringVar(&saveDir, "save-dir", "", "save images of results in this directory")
	fl.BoolVar(&jsonOut, "json", false, "print each event as a JSON line")
	fl.StringVarP(&sandboxID, "sandbox", "s", "", "the sandbox (default: $AIRLOCK_SANDBOX, else a one-off sandbox)")
	fl.StringVar(&template, "template", "code-interpreter", "template of a one-off sandbox")
	return cmd
}

// createCodeSandbox creates a one-off sandbox of template for a cell,
// waiting for the template's build on its first use.
func (a *app) createCodeSandbox(ctx context.Context, c *client.Client, template string) (*api.Sandbox, bool, error) {
	return a.createSandbox(ctx, c, api.CreateSandboxRequest{Template: template}, true, client.WithIdempotencyKey(newIdempotencyKey()))
}

// codeSource returns the cell's code from arg ("" or "-": none), -f or
// stdin.
func (a *app) codeSource(arg, file string) (string, error) {
	var r io.Reader
	switch {
	case file != "" && arg != "":
		return "", usagef("give CODE or --file, not both")
	case file != "":
		f, err := os.Open(file)
		if err != nil {
			return "", err
		}
		defer f.Close()
		r = f
	case arg != "" && arg != "-":
		return arg, nil
	default:
		r = a.stdin
	}
	b, err := io.ReadAll(io.LimitReader(r, maxCLICode+1))
	if err != nil {
		return "", fmt.Errorf("reading code: %w", err)
	}
	if len(b) > maxCLICode {
		return "", usagef("code is larger than %d bytes", maxCLICode)
	}
	return string(b), nil
}

// imageSaver writes result images into a directory as result-N.ext, N
// numbered on from the highest already there.
type imageSaver struct {
	dir  string
	next int
}

// resultNameRE is the name of a saved result image.
var resultNameRE = lazyregexp.New(`^result-([0-9]{1,9})\.[a-z]+$`)

// newImageSaver makes dir if it is missing and finds the next free number.
func newImageSaver(dir string) (*imageSaver, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--save-dir: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("--save-dir: %w", err)
	}
	s := &imageSaver{dir: dir, next: 1}
	for _, e := range ents {
		if m := resultNameRE.FindStringSubmatch(e.Name()); m != nil {
			if n, err := strconv.Atoi(m[1]); err == nil && n >= s.next {
				s.next = n + 1
			}
		}
	}
	return s, nil
}

// save writes b as the next result-N.ext and returns its path. A name taken
// meanwhile (another run saving into the same directory) is skipped, never
// overwritten.
func (s *imageSaver) save(ext string, b []byte) (string, error) {
	for {
		path := filepath.Join(s.dir, fmt.Sprintf("result-%d.%s", s.next, ext))
		s.next++
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return "", err
		}
		_, err = f.Write(b)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path)
			return "", err
		}
		return path, nil
	}
}

// saveImages writes ev's images with s (when set) and says where, or says
// that there was an image to save.
func (a *app) saveImages(ev api.CodeEvent, s *imageSaver) error {
	var first error
	for _, img := range []struct{ data, ext string }{{ev.PNG, "png"}, {ev.JPEG, "jpg"}, {ev.SVG, "svg"}} {
		if img.data == "" {
			continue
		}
		if s == nil {
			fmt.Fprintf(a.stderr, "[%s image; use --save-dir to save it]\n", strings.ToUpper(img.ext))
			continue
		}
		b := []byte(img.data)
		if img.ext != "svg" {
			var err error
			if b, err = base64.StdEncoding.DecodeString(img.data); err != nil {
				fmt.Fprintf(a.stderr, "[%s image not saved: the server sent bad base64]\n", strings.ToUpper(img.ext))
				continue
			}
		}
		path, err := s.save(img.ext, b)
		if err != nil {
			fmt.Fprintf(a.stderr, "airlock: saving image: %v\n", err)
			if first == nil {
				first = fmt.Errorf("saving an image: %w", err)
			}
			continue
		}
		fmt.Fprintf(a.stderr, "[saved %s]\n", path)
	}
	return first
}
