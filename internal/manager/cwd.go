package manager

import (
	"bufio"
	"context"
	"errors"
	"io"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/agentclient"
	"github.com/airlockhq/airlock/internal/agentproto"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// maxPasswdBytes bounds how much of a sandbox's /etc/passwd is read: the
// file is the sandbox's to write, so it may be anything.
const maxPasswdBytes = 1 << 20

// cachedHome returns user's default exec directory if it is known.
func (sb *sandbox) cachedHome(user string) (string, bool) {
	sb.homesMu.Lock()
	defer sb.homesMu.Unlock()
	h, ok := sb.homes[user]
	return h, ok
}

// defaultCwd returns the directory an exec of user without a cwd runs in,
// as the agent chooses it: the user's home from the sandbox's /etc/passwd,
// or "/" when it has none or it is not a directory. It costs two agent
// calls the first time per user and is cached after, so exec records name
// the effective cwd without a protocol change. "" when it cannot be told
// (the agent is gone).
func (sb *sandbox) defaultCwd(ctx context.Context, user string) string {
	if h, ok := sb.cachedHome(user); ok {
		return h
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var home string
	err := sb.withAgent(ctx, func(c *agentclient.Client) error {
		rc, _, err := c.ReadFile(ctx, "/etc/passwd", user)
		if err != nil {
			return err
		}
		// Read it whole (within the bound) so that the transfer ends
		// cleanly before the connection is used again.
		b, err := io.ReadAll(io.LimitReader(rc, maxPasswdBytes))
		rc.Close()
		if err != nil {
			return err
		}
		home = passwdHome(strings.NewReader(string(b)), user)
		if home == "" {
			home = "/"
			return nil
		}
		// The agent falls back to "/" when the home is missing or not a
		// directory (a symlink is followed by the agent, so it counts).
		fi, err := c.Stat(ctx, home, user)
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
			home = "/"
		case err != nil:
			return err
		case fi.Type != agentproto.FileTypeDir && fi.Type != agentproto.FileTypeSymlink:
			home = "/"
		}
		return nil
	})
	if err != nil {
		sb.m.log.Debug("resolving default cwd", "sandbox_id", sb.id, "user", user, "err", err)
		return ""
	}
	sb.homesMu.Lock()
	if sb.homes == nil {
		sb.homes = map[string]string{}
	}
	sb.homes[user] = home
	sb.homesMu.Unlock()
	return home
}

// passwdHome returns user's home directory from a passwd file, "" when
// the user is not in it.
func passwdHome(r io.Reader, user string) string {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// name:password:uid:gid:gecos:home:shell
		f := strings.Split(sc.Text(), ":")
		if len(f) >= 7 && f[0] == user && strings.HasPrefix(f[5], "/") {
			return f[5]
		}
	}
	return ""
}

// isGone reports whether the sandbox stopped being live.
func (sb *sandbox) isGone() bool {
	select {
	case <-sb.gone:
		return true
	default:
		return false
	}
}
