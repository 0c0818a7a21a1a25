package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/lazyregexp"
	"github.com/airlockhq/airlock/internal/store"
	"github.com/airlockhq/airlock/internal/template"
)

type fromKind int

const (
	fromDebian fromKind = iota + 1
	fromTemplate
	fromImage
)

// DebianFrom is the FROM of the shipped base: Debian bookworm (minbase, with
// python3 and a user) made by debootstrap.
const DebianFrom = "debian:bookworm"

// plan is a validated build request.
type plan struct {
	req         Request
	spec        *Spec
	context     *buildContext
	fromKind    fromKind
	fromName    string
	fromVersion int
}

// templateRefRE is "name" or "name@N".
var templateRefRE = lazyregexp.New(`^([a-z0-9][a-z0-9._-]{0,62})(?:@([1-9][0-9]{0,8}))?$`)

// ParseRef splits a template reference "name" or "name@N" (0: newest).
func ParseRef(ref string) (string, int, error) {
	m := templateRefRE.FindStringSubmatch(ref)
	if m == nil {
		return "", 0, userErr(errdefs.ErrInvalidArgument, "template %q must be a name or name@version", truncate(ref, 64))
	}
	v := 0
	if m[2] != "" {
		v, _ = strconv.Atoi(m[2])
	}
	return m[1], v, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// checkFrom validates FROM before a version is taken: the reference exists
// and does not lead back to the template being built.
func (b *Builder) checkFrom(ctx context.Context, p *plan) error {
	in := p.spec.From
	fail := func(format string, args ...any) error {
		return &SpecError{Line: in.Line, Instr: InstrFrom, Msg: fmt.Sprintf(format, args...)}
	}
	ref := in.From
	switch {
	case ref == DebianFrom:
		p.fromKind = fromDebian
	case ref == "image":
		if p.req.ImagePath == "" {
			return fail("FROM image needs an OCI image tarball uploaded with the build (multipart part \"image\")")
		}
		p.fromKind = fromImage
		return nil
	}
	if p.req.ImagePath != "" {
		return fail("an uploaded image is built on with FROM image, not FROM %s", ref)
	}
	if p.fromKind == fromDebian {
		return nil
	}
	m := templateRefRE.FindStringSubmatch(ref)
	if m == nil {
		if strings.ContainsAny(ref, ":/") {
			return fail("%s: images are not pulled from registries; upload the image tarball (docker save) and build FROM image", ref)
		}
		return fail("%q is not a template (name or name@version), %s or image", ref, DebianFrom)
	}
	name, version := m[1], 0
	if m[2] != "" {
		version, _ = strconv.Atoi(m[2])
	}
	p.fromKind, p.fromName, p.fromVersion = fromTemplate, name, version
	if name == p.req.Name && version == 0 {
		return fail("cyclic FROM: template %s cannot be built from itself (to build on an earlier version, pin it: FROM %s@N)", name, name)
	}
	tv, err := b.st.GetTemplateVersion(ctx, []string{p.req.Tenant, ""}, name, version)
	if err != nil {
		if !errdefs.IsNotFound(err) {
			return err
		}
		if template.IsShipped(name) && version == 0 {
			return nil // built on demand by the build
		}
		return fail("template %s not found", ref)
	}
	cfg, err := unmarshalConfig(tv.Config)
	if err != nil {
		return err
	}
	if version == 0 && slices.Contains(cfg.Lineage, p.req.Name) {
		return fail("cyclic FROM: %s is built from %s, so %s cannot be built from %s (pin a version to build on it anyway)",
			name, p.req.Name, p.req.Name, name)
	}
	return nil
}

// parent is what a build starts from.
type parent struct {
	layers  []string
	config  template.Config
	lineage []string
}

// resolveParent turns FROM into layers, holding them for the build.
func (b *Builder) resolveParent(ctx context.Context, bs *buildState, p *plan) (parent, error) {
	switch p.fromKind {
	case fromImage:
		return b.importParent(ctx, bs, p.req.ImagePath)
	case fromDebian:
		tv, err := b.shippedVersion(ctx, bs, "base")
		if err != nil {
			return parent{}, err
		}
		return parentOf(tv)
	}
	tv, err := b.lookupHeld(ctx, bs.id, []string{p.req.Tenant, ""}, p.fromName, p.fromVersion)
	if errdefs.IsNotFound(err) && template.IsShipped(p.fromName) && p.fromVersion == 0 {
		tv, err = b.shippedVersion(ctx, bs, p.fromName)
	}
	if err != nil {
		if errdefs.IsNotFound(err) {
			return parent{}, userErr(errdefs.ErrInvalidArgument, "line %d: FROM: template %s not found (deleted since the build was submitted)", p.spec.From.Line, p.spec.From.From)
		}
		return parent{}, err
	}
	pa, err := parentOf(tv)
	if err != nil {
		return parent{}, err
	}
	pa.lineage = append(pa.lineage, tv.Name)
	return pa, nil
}

func parentOf(tv store.TemplateVersion) (parent, error) {
	cfg, err := unmarshalConfig(tv.Config)
	if err != nil {
		return parent{}, err
	}
	return parent{layers: slices.Clone(tv.Layers), config: cfg, lineage: slices.Clone(cfg.Lineage)}, nil
}

// lookupHeld finds a ready version and holds its layers for build id, in
// one step for the collector.
func (b *Builder) lookupHeld(ctx context.Context, id string, tenants []string, name string, version int) (store.TemplateVersion, error) {
	b.gcMu.RLock()
	defer b.gcMu.RUnlock()
	tv, err := b.st.GetTemplateVersion(ctx, tenants, name, version)
	if err != nil {
		return tv, err
	}
	b.inflMu.Lock()
	for _, ref := range tv.Layers {
		b.inflight[id+"\x00"+ref]++
	}
	b.inflMu.Unlock()
	return tv, nil
}

// importParent imports the uploaded image, adding the accounts layer an
// image made for docker lacks.
func (b *Builder) importParent(ctx context.Context, bs *buildState, archive string) (parent, error) {
	bs.log.logf("importing the uploaded image")
	img, err := b.tmpl.ImportImage(ctx, archive, template.ImportOptions{
		MaxBytes: b.cfg.MaxImageBytes,
		Hold:     func(ref string) { b.hold(bs.id, ref) },
		Progress: func(format string, args ...any) { bs.log.logf("  "+format, args...) },
	})
	if err != nil {
		return parent{}, asUserErr(fmt.Errorf("importing the image: %w", err))
	}
	layers := img.Layers
	paths, err := b.tmpl.LayerPaths(layers)
	if err != nil {
		return parent{}, err
	}
	key, write, needed, err := template.AccountsLayer(paths)
	if err != nil {
		return parent{}, fmt.Errorf("checking the image's accounts: %w", err)
	}
	if needed {
		ref := template.LayerRef(key)
		if !b.hold(bs.id, ref) {
			bs.log.logf("  adding the default user %q and /tmp the image lacks", "user")
			w, err := b.tmpl.NewLayer()
			if err != nil {
				return parent{}, err
			}
			if err := write(w.Root()); err != nil {
				w.Discard()
				return parent{}, fmt.Errorf("writing accounts layer: %w", err)
			}
			if _, err := w.Commit(key, template.LayerMeta{Parent: layers[len(layers)-1], CreatedBy: "airlock accounts"}); err != nil {
				return parent{}, err
			}
		}
		layers = append(layers, ref)
	}
	bs.log.logf("image imported: %d layers (%d were in the store)", len(img.Layers), img.Reused)
	user := img.Config.User
	if user != "" && !userRE.MatchString(user) {
		// "1000" or "app:app": the agent runs commands by user name.
		bs.log.logf("  the image's user %q is not a user name: steps run as root (set USER)", user)
		user = ""
	}
	wd := img.Config.Workdir
	if wd != "" && !path.IsAbs(wd) {
		wd = ""
	}
	return parent{layers: layers, config: template.Config{Env: img.Config.Env, Workdir: wd, User: user}}, nil
}

// state is what ENV, WORKDIR and USER set for the steps after them.
type state struct {
	env     map[string]string
	workdir string
	user    string
}

func (s state) runUser() string {
	if s.user == "" {
		return "root" // a Dockerfile's default
	}
	return s.user
}

// runSpec runs a spec build.
func (b *Builder) runSpec(ctx context.Context, bs *buildState, p *plan) (result, error) {
	pa, err := b.resolveParent(ctx, bs, p)
	if err != nil {
		return result{}, err
	}
	for _, ref := range pa.layers {
		if !b.hold(bs.id, ref) {
			return result{}, userErr(errdefs.ErrNotFound, "FROM %s: a layer of it is missing", p.spec.From.From)
		}
	}
	st := state{env: maps.Clone(pa.config.Env), workdir: pa.config.Workdir, user: pa.config.User}
	if st.env == nil {
		st.env = map[string]string{}
	}
	layerSteps := 0
	for _, in := range p.spec.Steps {
		if in.Cmd == InstrRun || in.Cmd == InstrCopy {
			layerSteps++
		}
	}
	if n := len(pa.layers) + layerSteps + 1; n > b.cfg.MaxLayers {
		return result{}, userErr(errdefs.ErrInvalidArgument, "the template would have %d layers, more than the %d a sandbox can stack: combine RUN steps", n, b.cfg.MaxLayers)
	}
	layers := pa.layers
	wdPending := false
	total := len(p.spec.Steps)
	for i, in := range p.spec.Steps {
		if err := ctx.Err(); err != nil {
			return result{}, err
		}
		label := fmt.Sprintf("step %d/%d (line %d) %s", i+1, total, in.Line, in.Summary())
		bs.log.logf("%s", label)
		switch in.Cmd {
		case InstrEnv:
			for _, kv := range in.Env {
				st.env[kv[0]] = kv[1]
			}
		case InstrWorkdir:
			wd := in.Path
			if !path.IsAbs(wd) {
				wd = path.Join(orRoot(st.workdir), wd)
			}
			st.workdir = path.Clean(wd)
			wdPending = true
		case InstrUser:
			st.user = in.User
		case InstrRun, InstrCopy:
			ref, err := b.layerStep(ctx, bs, p, in, label, layers, st)
			if err != nil {
				return result{}, err
			}
			layers = append(layers, ref)
			wdPending = false
		}
	}
	if wdPending && st.workdir != "/" {
		// Nothing ran in the last WORKDIR: make it, as docker does.
		in := Instruction{Line: 0, Cmd: InstrWorkdir, Raw: "WORKDIR " + st.workdir, Path: st.workdir}
		ref, err := b.layerStep(ctx, bs, p, in, "creating WORKDIR "+st.workdir, layers, st)
		if err != nil {
			return result{}, err
		}
		layers = append(layers, ref)
	}
	cfg := template.Config{
		Env: st.env, Workdir: st.workdir, User: st.user,
		StartCmd: pa.config.StartCmd, ReadyCmd: pa.config.ReadyCmd,
		From: p.spec.From.From, Lineage: pa.lineage,
	}
	if p.req.StartCmd != nil {
		cfg.StartCmd = *p.req.StartCmd
	}
	if p.req.ReadyCmd != nil {
		cfg.ReadyCmd = *p.req.ReadyCmd
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s", p.req.Spec, cfg.StartCmd, cfg.ReadyCmd)
	return result{layers: layers, config: cfg, specHash: hex.EncodeToString(h.Sum(nil))}, nil
}

func orRoot(dir string) string {
	if dir == "" {
		return "/"
	}
	return dir
}

// stepKey is the content address of a step's layer: the tenant (a layer
// made by one tenant's commands is never handed to another), the parent
// layer, the state the step runs with, the instruction and its inputs.
func stepKey(tenant, parentRef string, st state, in Instruction, inputs string) string {
	h := sha256.New()
	fmt.Fprintf(h, "airlock layer v1\ntenant %q\nparent %s\nuser %q\nworkdir %q\n", tenant, parentRef, st.runUser(), st.workdir)
	for _, kv := range sortedEnv(st.env) {
		fmt.Fprintf(h, "env %q\n", kv)
	}
	canon, _ := json.Marshal(struct {
		Cmd   string   `json:"cmd"`
		Shell string   `json:"shell,omitempty"`
		Exec  []string `json:"exec,omitempty"`
		Srcs  []string `json:"srcs,omitempty"`
		Dest  string   `json:"dest,omitempty"`
		Chown string   `json:"chown,omitempty"`
		Path  string   `json:"path,omitempty"`
	}{in.Cmd, in.Shell, in.Exec, in.Srcs, in.Dest, in.Chown, in.Path})
	fmt.Fprintf(h, "instruction %s\ninputs %s\n", canon, inputs)
	return hex.EncodeToString(h.Sum(nil))
}

// layerStep makes (or finds in the cache) the layer of a RUN, COPY or
// WORKDIR step on layers.
func (b *Builder) layerStep(ctx context.Context, bs *buildState, p *plan, in Instruction, label string, layers []string, st state) (string, error) {
	stepErr := func(cls error, format string, args ...any) error {
		return &Error{Msg: label + ": " + fmt.Sprintf(format, args...), Err: cls}
	}
	var (
		sel    selection
		inputs string
	)
	if in.Cmd == InstrCopy {
		var err error
		if sel, err = p.context.selectSources(in.Srcs); err != nil {
			return "", stepErr(errdefs.ErrInvalidArgument, "%v", err)
		}
		if (len(in.Srcs) > 1 || strings.ContainsAny(strings.Join(in.Srcs, ""), "*?[")) && !strings.HasSuffix(in.Dest, "/") {
			return "", stepErr(errdefs.ErrInvalidArgument, "with several sources the destination must end with /")
		}
		inputs = sel.inputHash()
	}
	key := stepKey(p.req.Tenant, layers[len(layers)-1], st, in, inputs)
	ref := template.LayerRef(key)
	if b.hold(bs.id, ref) {
		bs.log.logf("  cached")
		return ref, nil
	}
	sb, err := b.startSandbox(ctx, layers, in.Cmd == InstrRun)
	if err != nil {
		var ue *Error
		if errors.As(err, &ue) {
			return "", stepErr(ue.Err, "%s", ue.Msg)
		}
		// The cause can name host paths: it goes to the daemon's log, the
		// build log gets the safe message.
		b.log.Warn("build sandbox failed to start", "build_id", bs.id, "err", err)
		return "", stepErr(err, "the build sandbox failed to start")
	}
	defer sb.destroy(ctx)
	out := &tail{max: 4 << 10}
	w := io.MultiWriter(bs.log, out)
	if err := sb.ensureWorkdir(ctx, st.workdir, st.runUser(), w); err != nil {
		return "", stepErr(errdefs.ErrInvalidArgument, "%v", err)
	}
	switch in.Cmd {
	case InstrRun:
		if err := b.runStep(ctx, sb, in, st, w, out); err != nil {
			return "", stepErr(errdefs.ErrInvalidArgument, "%v", err)
		}
	case InstrCopy:
		if err := b.copyStep(ctx, sb, p.context, sel, in, st, w); err != nil {
			return "", stepErr(errdefs.ErrInvalidArgument, "%v", err)
		}
	}
	ref, stats, err := sb.capture(ctx, key, template.LayerMeta{Parent: layers[len(layers)-1], CreatedBy: in.Summary()})
	if err != nil {
		return "", stepErr(err, "saving the layer failed")
	}
	bs.log.logf("  layer %s: %d files, %d directories, %d links, %d whiteouts, %d KiB",
		shortKey(key), stats.Files, stats.Dirs, stats.Symlinks+stats.Hardlinks, stats.Whiteouts, stats.Bytes>>10)
	return ref, nil
}

func shortKey(k string) string { return k[:12] }

// networkHint explains a failed RUN that looks like it wanted the network.
var netFailure = lazyregexp.New(`(?i)temporary failure in name resolution|could not resolve|network is unreachable|name or service not known|failed to establish a new connection|connection refused|no address associated`)

// runStep runs a RUN.
func (b *Builder) runStep(ctx context.Context, sb *buildSandbox, in Instruction, st state, w io.Writer, out *tail) error {
	req := agentproto.ExecRequest{
		Env: maps.Clone(st.env), User: st.runUser(), Cwd: orRoot(st.workdir),
		TimeoutMS: b.cfg.StepTimeout.Milliseconds(), MaxOutputBytes: agentproto.HardMaxOutputBytes,
	}
	if in.Exec != nil {
		req.Argv = in.Exec
	} else {
		req.Argv = []string{"/bin/sh", "-c", in.Shell}
	}
	res, err := sb.exec(ctx, req, w)
	var refused *agentproto.Error
	if err != nil && errdefs.IsInvalidArgument(err) && errors.As(err, &refused) {
		// USER names no user of the image, WORKDIR is not a directory.
		return errors.New("the command could not start: " + refused.Message)
	}
	if err != nil {
		return fmt.Errorf("running the command: %w", err)
	}
	if res.Status == agentproto.StatusExited && res.ExitCode == 0 {
		return nil
	}
	msg := "the command " + describe(res, b.cfg.StepTimeout)
	if res.Status == agentproto.StatusOOM {
		msg += fmt.Sprintf(" (a build sandbox has %d MiB)", b.cfg.Resources.MemoryMB)
	}
	if b.cfg.Network == nil && netFailure.MatchString(string(out.buf)) {
		msg += "; this host gives build sandboxes no network (sandbox networking is off: no nftables, not root, or AIRLOCK_NO_NETWORK=1), so RUN cannot download anything (COPY files in from the build context instead)"
	}
	if t := out.String(); t != "" {
		msg += "; last output:\n" + t
	}
	return errors.New(msg)
}

// copyStep runs a COPY: the selected context entries are unpacked in the
// destination by the agent, as root (or chowned after).
func (b *Builder) copyStep(ctx context.Context, sb *buildSandbox, c *buildContext, sel selection, in Instruction, st state, w io.Writer) error {
	dest := in.Dest
	trailing := strings.HasSuffix(dest, "/")
	if !path.IsAbs(dest) {
		dest = path.Join(orRoot(st.workdir), dest)
	}
	dest = path.Clean(dest)
	destDir, rename := dest, ""
	if sel.single && !trailing {
		fi, err := sb.client.Stat(ctx, dest, "root")
		if err != nil || fi.Type != agentproto.FileTypeDir {
			destDir, rename = path.Dir(dest), path.Base(dest)
		}
	}
	// The directories the copy creates (destDir and its missing parents)
	// are the --chown owner's too, as with Docker.
	var created []string
	if in.Chown != "" {
		for d := destDir; d != "/"; d = path.Dir(d) {
			_, err := sb.client.Stat(ctx, d, "root")
			var ae *agentproto.Error
			if err != nil && !errors.As(err, &ae) {
				return fmt.Errorf("--chown: looking at %s: %w", d, err)
			}
			if err == nil || ae.Code != agentproto.CodeNotFound {
				break // there (or in the way: the copy says so)
			}
			created = append(created, d)
		}
	}
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		err := c.writeTar(pw, sel, rename)
		pw.CloseWithError(err)
		errc <- err
	}()
	err := sb.client.TarIn(ctx, destDir, "root", pr)
	pr.CloseWithError(io.ErrClosedPipe)
	if werr := <-errc; werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		var ae *agentproto.Error
		if errors.As(err, &ae) {
			return fmt.Errorf("copying into %s: %s", destDir, ae.Message)
		}
		return fmt.Errorf("copying into %s: %w", destDir, err)
	}
	fmt.Fprintf(w, "copied %d entries into %s\n", len(sel.items), destDir)
	if in.Chown == "" {
		return nil
	}
	var targets []string
	if rename != "" {
		targets = []string{path.Join(destDir, rename)}
	} else {
		for _, t := range sel.tops {
			targets = append(targets, path.Join(destDir, t))
		}
		if len(targets) == 0 && len(created) == 0 {
			targets = []string{destDir}
		}
	}
	if len(targets) > 0 {
		if err := b.chown(ctx, sb, w, in.Chown, "-hR", targets); err != nil {
			return err
		}
	}
	if len(created) > 0 {
		// Not recursive: what was there before the copy keeps its owner.
		if err := b.chown(ctx, sb, w, in.Chown, "-h", created); err != nil {
			return err
		}
	}
	return nil
}

// chown runs chown flag owner -- paths as root in a build sandbox.
func (b *Builder) chown(ctx context.Context, sb *buildSandbox, w io.Writer, owner, flag string, paths []string) error {
	res, err := sb.exec(ctx, agentproto.ExecRequest{
		Argv: append([]string{"chown", flag, owner, "--"}, paths...), User: "root", Cwd: "/", TimeoutMS: 600_000,
	}, w)
	if err != nil {
		return fmt.Errorf("--chown: %w", err)
	}
	if res.Status != agentproto.StatusExited || res.ExitCode != 0 {
		return fmt.Errorf("--chown=%s: chown %s", owner, describe(res, 0))
	}
	return nil
}

func marshalConfig(c template.Config) (json.RawMessage, error) {
	return json.Marshal(c)
}

func unmarshalConfig(b json.RawMessage) (template.Config, error) {
	var c template.Config
	if len(b) == 0 {
		return c, nil
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("template config: %w", err)
	}
	return c, nil
}
