package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
)

// buildFailedError is a build that ran and failed; its log was shown.
type buildFailedError struct {
	id, msg string
}

func (e buildFailedError) Error() string { return fmt.Sprintf("build %s failed: %s", e.id, e.msg) }

func (a *app) newTemplateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "template",
		Aliases: []string{"templates", "tpl"},
		Short:   "Build, import, list and delete templates",
		Args:    cobra.ArbitraryArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(
		a.newTemplateBuildCmd(),
		a.newTemplateImportCmd(),
		a.newTemplateLsCmd(),
		a.newTemplateInfoCmd(),
		a.newTemplateRmCmd(),
		a.newTemplateLogsCmd(),
	)
	return cmd
}

type buildFlags struct {
	file, name, image  string
	startCmd, readyCmd string
	detach             bool
}

func (a *app) newTemplateBuildCmd() *cobra.Command {
	var f buildFlags
	cmd := &cobra.Command{
		Use:   "build -f SPEC --name NAME [CONTEXT_DIR]",
		Short: "Build a template from a spec (a Dockerfile subset) and print NAME@VERSION",
		Long: `Build a template from a spec: a Dockerfile subset with FROM (debian:bookworm,
a template name or name@version, or image), RUN, COPY, ENV, WORKDIR and USER.
COPY takes its sources from CONTEXT_DIR, which is sent as a tar. Every build
is a new version; steps whose inputs did not change are reused from the cache.

The build's log is printed on stderr as it happens; NAME@VERSION on stdout
once it succeeded. Without -f, --name must be a shipped template (base,
python, node, code-interpreter), which is built from Debian's packages.`,
		Example: `  airlock template build -f Dockerfile --name myenv .
  airlock template build -f - --name tools <<'EOF'
  FROM python
  RUN pip install --no-index /wheels/*.whl
  EOF
  airlock template build --name node`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctxDir := ""
			if len(args) == 1 {
				ctxDir = args[0]
			}
			return a.runBuild(cmd, f, ctxDir)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.file, "file", "f", "", "the spec file (- for stdin)")
	fl.StringVarP(&f.name, "name", "n", "", "the template's name (required)")
	fl.StringVar(&f.image, "image", "", "an OCI image tarball (docker save) the spec builds on with FROM image")
	fl.StringVar(&f.startCmd, "start-cmd", "", "command started in every sandbox of the template before it is ready")
	fl.StringVar(&f.readyCmd, "ready-cmd", "", "command retried until it exits 0 before a sandbox is ready")
	fl.BoolVarP(&f.detach, "detach", "d", false, "print the build id and return at once")
	return cmd
}

func (a *app) newTemplateImportCmd() *cobra.Command {
	var f buildFlags
	cmd := &cobra.Command{
		Use:   "import NAME IMAGE.tar",
		Short: "Import an OCI image tarball (docker save output or an OCI layout) as a template",
		Example: `  docker save python:3.12-slim -o py.tar && airlock template import py312 py.tar
  airlock template import py312 py.tar --start-cmd 'python3 -m http.server 8000'`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f.name, f.image = args[0], args[1]
			return a.runBuild(cmd, f, "")
		},
	}
	cmd.Flags().StringVar(&f.startCmd, "start-cmd", "", "command started in every sandbox of the template before it is ready")
	cmd.Flags().StringVar(&f.readyCmd, "ready-cmd", "", "command retried until it exits 0 before a sandbox is ready")
	cmd.Flags().BoolVarP(&f.detach, "detach", "d", false, "print the build id and return at once")
	return cmd
}

// runBuild submits a build and follows it.
func (a *app) runBuild(cmd *cobra.Command, f buildFlags, ctxDir string) error {
	if f.name == "" {
		return usagef("--name is required")
	}
	req := api.TemplateBuildRequest{Name: f.name}
	if f.startCmd != "" {
		req.StartCmd = &f.startCmd
	}
	if f.readyCmd != "" {
		req.ReadyCmd = &f.readyCmd
	}
	switch f.file {
	case "":
		if ctxDir != "" {
			return usagef("a context directory needs a spec (-f)")
		}
	case "-":
		b, err := io.ReadAll(io.LimitReader(a.stdin, 1<<20))
		if err != nil {
			return fmt.Errorf("reading the spec: %w", err)
		}
		req.Dockerfile = string(b)
	default:
		b, err := os.ReadFile(f.file)
		if err != nil {
			return fmt.Errorf("reading the spec: %w", err)
		}
		req.Dockerfile = string(b)
	}
	var uploads client.BuildUploads
	if ctxDir != "" {
		fi, err := os.Stat(ctxDir)
		if err != nil {
			return fmt.Errorf("context: %w", err)
		}
		if !fi.IsDir() {
			return usagef("context %s is not a directory", ctxDir)
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeTar(pw, ctxDir, io.Discard)) }() // sockets, devices: nothing a build copies
		defer pr.Close()
		uploads.Context = pr
	}
	if f.image != "" {
		img, err := os.Open(f.image)
		if err != nil {
			return fmt.Errorf("image: %w", err)
		}
		defer img.Close()
		uploads.Image = img
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	started, err := c.BuildTemplate(cmd.Context(), req, uploads)
	if err != nil {
		return err
	}
	if f.detach {
		if a.output == "json" {
			return printJSON(a.stdout, started)
		}
		_, err := fmt.Fprintln(a.stdout, started.BuildID)
		return err
	}
	fmt.Fprintf(a.stderr, "build %s: %s@%d\n", started.BuildID, started.Name, started.Version)
	return a.follow(cmd, c, started.BuildID)
}

// follow streams a build's log to stderr and reports its end.
func (a *app) follow(cmd *cobra.Command, c *client.Client, id string) error {
	b, err := c.FollowTemplateBuild(cmd.Context(), id, a.stderr)
	if err != nil {
		return err
	}
	if a.output == "json" {
		if err := printJSON(a.stdout, b); err != nil {
			return err
		}
	}
	if b.Status != api.BuildReady {
		return buildFailedError{id: id, msg: b.Error}
	}
	if a.output != "json" {
		fmt.Fprintf(a.stdout, "%s@%d\n", b.Name, b.Version)
	}
	return nil
}

func (a *app) newTemplateLsCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the templates you can use (newest versions)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.ListTemplates(cmd.Context())
			if err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, l)
			}
			now := time.Now()
			t := newTable(a.stdout, "NAME", "VERSION", "STATUS", "SOURCE", "LAYERS", "SIZE", "CREATED", "VERSIONS")
			for _, tp := range l.Templates {
				size, created, version := "", "", ""
				if tp.Status == api.TemplateReady {
					size = bytesHuman(uint64(tp.SizeBytes))
					created = ago(tp.CreatedAt, now)
					version = strconv.Itoa(tp.Version)
				}
				t.row(tp.Name, version, tp.Status, tp.Source, strconv.Itoa(tp.Layers), size, created, joinInts(tp.Versions))
			}
			return t.flush()
		},
	}
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func (a *app) newTemplateInfoCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "info NAME[@VERSION]",
		Short: "Show a template version",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			tp, err := c.GetTemplate(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, tp)
			}
			created := ""
			if !tp.CreatedAt.IsZero() {
				created = tp.CreatedAt.Format(time.RFC3339) + " (" + ago(tp.CreatedAt, time.Now()) + ")"
			}
			return kvTable(a.stdout, [][2]string{
				{"name", fmt.Sprintf("%s@%d", tp.Name, tp.Version)},
				{"id", tp.ID},
				{"status", tp.Status},
				{"source", tp.Source},
				{"from", tp.From},
				{"created", created},
				{"layers", strconv.Itoa(tp.Layers)},
				{"size", bytesHuman(uint64(tp.SizeBytes))},
				{"env", formatMap(tp.Env)},
				{"workdir", tp.Workdir},
				{"user", tp.User},
				{"start_cmd", tp.StartCmd},
				{"ready_cmd", tp.ReadyCmd},
				{"build", tp.BuildID},
				{"versions", joinInts(tp.Versions)},
			})
		},
	}
}

func (a *app) newTemplateRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME[@VERSION]…",
		Aliases: []string{"delete"},
		Short:   "Delete templates (every version, or NAME@VERSION for one); sandboxes using them keep running",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			res := deleted{Deleted: []string{}}
			for _, ref := range args {
				if err := c.DeleteTemplate(cmd.Context(), ref); err != nil {
					res.fail(a, ref, err)
					continue
				}
				res.Deleted = append(res.Deleted, ref)
			}
			return a.reportDeleted(res)
		},
	}
}

func (a *app) newTemplateLogsCmd() *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs BUILD_ID",
		Short: "Show a build's log (-f: follow it until the build ends)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if follow {
				logw := a.stdout
				if a.output == "json" {
					logw = a.stderr // stdout is the build's JSON
				}
				b, err := c.FollowTemplateBuild(cmd.Context(), args[0], logw)
				if err != nil {
					return err
				}
				if a.output == "json" {
					if err := printJSON(a.stdout, b); err != nil {
						return err
					}
				}
				if b.Status != api.BuildReady {
					return buildFailedError{id: b.ID, msg: b.Error}
				}
				return nil
			}
			b, err := c.TemplateBuild(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, b)
			}
			if _, err := io.WriteString(a.stdout, b.Log); err != nil {
				return err
			}
			if b.Status == api.BuildFailed {
				return buildFailedError{id: b.ID, msg: b.Error}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the log until the build ends")
	return cmd
}

// isBuildFailed reports whether err is a failed build.
func isBuildFailed(err error) bool {
	var bf buildFailedError
	return errors.As(err, &bf)
}
