package cli

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/api"
)

// maxCLICode bounds code read from a file or stdin (the server's limit is
// 1 MiB as well).
const maxCLICode = 1 << 20

func (a *app) newCodeCmd() *cobra.Command {
	var (
		contextID, language, file, saveDir string
		timeout                            float64
		jsonOut                            bool
	)
	cmd := &cobra.Command{
		Use:   "code SANDBOX [CODE]",
		Short: "Run a code-interpreter cell in a sandbox (python, javascript, bash)",
		Long: `Run a cell in a stateful code-interpreter context of a sandbox: variables,
imports and the working directory persist between calls. Without --context
the cell runs in the sandbox's default context of --language.

The code is CODE, or the file given with -f, or stdin when CODE is "-" or
missing. stdout and stderr are streamed; the value of the last expression
is printed; images (PNG, JPEG, SVG) are saved to --save-dir when given.
With --json every event is printed as one JSON line.

The exit status is 1 when the cell raised an error, 0 otherwise.`,
		Example: `  airlock code sbx_… 'import math; math.pi'
  airlock code --language javascript sbx_… '[1,2,3].map(x => x*2)'
  airlock code sbx_… -f analysis.py --save-dir ./charts
  echo 'ls | wc -l' | airlock code --language bash sbx_…`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			code, err := a.codeSource(args, file)
			if err != nil {
				return err
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
			failed, images := false, 0
			for ev, err := range c.RunCodeStream(cmd.Context(), args[0], req) {
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
					images += a.saveImages(ev, saveDir, images)
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
	return cmd
}

// codeSource returns the cell's code from the argument, -f or stdin.
func (a *app) codeSource(args []string, file string) (string, error) {
	var r io.Reader
	switch {
	case file != "" && len(args) == 2:
		return "", usagef("give CODE or --file, not both")
	case file != "":
		f, err := os.Open(file)
		if err != nil {
			return "", err
		}
		defer f.Close()
		r = f
	case len(args) == 2 && args[1] != "-":
		return args[1], nil
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

// saveImages writes ev's images to dir (if set) as result-N.ext and says
// where; it returns how many it saved.
func (a *app) saveImages(ev api.CodeEvent, dir string, n int) int {
	saved := 0
	for _, img := range []struct{ data, ext string }{{ev.PNG, "png"}, {ev.JPEG, "jpg"}, {ev.SVG, "svg"}} {
		if img.data == "" {
			continue
		}
		if dir == "" {
			fmt.Fprintf(a.stderr, "[%s image; use --save-dir to save it]\n", strings.ToUpper(img.ext))
			continue
		}
		b := []byte(img.data)
		if img.ext != "svg" {
			var err error
			if b, err = base64.StdEncoding.DecodeString(img.data); err != nil {
				continue
			}
		}
		path := filepath.Join(dir, fmt.Sprintf("result-%d.%s", n+saved+1, img.ext))
		if err := os.WriteFile(path, b, 0o644); err != nil {
			fmt.Fprintf(a.stderr, "saving image: %v\n", err)
			continue
		}
		saved++
		fmt.Fprintf(a.stderr, "[saved %s]\n", path)
	}
	return saved
}
