package agent

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/airlockhq/airlock/internal/agentproto"
)

// account is a user of the sandbox, read from its own passwd and group files
// (never the host's: the agent runs in the sandbox's mount namespace).
type account struct {
	Name   string
	Uid    uint32
	Gid    uint32
	Groups []uint32 // supplementary groups, including Gid
	Home   string
	Shell  string
}

// fileStamp identifies a version of a file; a changed stamp means re-read.
type fileStamp struct {
	ino, size int64
	mtime     syscall.Timespec
	ctime     syscall.Timespec
}

func stampOf(p string) (fileStamp, bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return fileStamp{}, false
	}
	return fileStamp{ino: int64(st.Ino), size: st.Size, mtime: st.Mtim, ctime: st.Ctim}, true
}

// userDB caches the parsed passwd and group files. Every exec and file
// operation looks a user up; re-parsing costs more than a stat, and users
// change (useradd in the sandbox) only when the files do.
type userDB struct {
	mu          sync.Mutex
	passwdStamp fileStamp
	groupStamp  fileStamp
	users       map[string]account  // by name, Groups holds the primary gid only
	members     map[string][]uint32 // user name -> supplementary gids
	loaded      bool
}

// lookupUser finds name ("" means the default user) in the passwd file and
// its groups in the group file. Numeric names are not accepted: the API
// speaks user names.
func (s *Server) lookupUser(name string) (*account, error) {
	if name == "" {
		name = s.defaultUser
	}
	db := &s.users
	db.mu.Lock()
	defer db.mu.Unlock()
	ps, pok := stampOf(s.passwdFile)
	gs, gok := stampOf(s.groupFile)
	if !pok {
		return nil, fmt.Errorf("reading user database: %s missing", s.passwdFile)
	}
	if !db.loaded || ps != db.passwdStamp || gs != db.groupStamp {
		users, err := parsePasswd(s.passwdFile)
		if err != nil {
			return nil, err
		}
		members := map[string][]uint32{}
		if gok {
			if members, err = parseGroups(s.groupFile); err != nil {
				return nil, err
			}
		}
		db.users, db.members, db.passwdStamp, db.groupStamp, db.loaded = users, members, ps, gs, true
	}
	u, ok := db.users[name]
	if !ok {
		return nil, &agentproto.Error{Code: agentproto.CodeInvalidArgument, Message: fmt.Sprintf("unknown user %q", name)}
	}
	acct := u
	acct.Groups = []uint32{u.Gid}
	for _, g := range db.members[name] {
		if g != u.Gid {
			acct.Groups = append(acct.Groups, g)
		}
	}
	return &acct, nil
}

func parsePasswd(p string) (map[string]account, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("reading user database: %w", err)
	}
	defer f.Close()
	users := map[string]account{}
	err = eachLine(f, func(fields []string) {
		// name:password:uid:gid:gecos:home:shell
		if len(fields) < 7 {
			return
		}
		uid, err1 := strconv.ParseUint(fields[2], 10, 32)
		gid, err2 := strconv.ParseUint(fields[3], 10, 32)
		if err1 != nil || err2 != nil {
			return
		}
		if _, dup := users[fields[0]]; dup {
			return // the first entry wins, as for getpwnam
		}
		a := account{Name: fields[0], Uid: uint32(uid), Gid: uint32(gid), Home: fields[5], Shell: fields[6]}
		if a.Home == "" {
			a.Home = "/"
		}
		if a.Shell == "" {
			a.Shell = "/bin/sh"
		}
		users[a.Name] = a
	})
	if err != nil {
		return nil, fmt.Errorf("reading user database: %w", err)
	}
	return users, nil
}

func parseGroups(p string) (map[string][]uint32, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("reading group database: %w", err)
	}
	defer f.Close()
	members := map[string][]uint32{}
	err = eachLine(f, func(fields []string) {
		// name:password:gid:member,member
		if len(fields) < 4 || fields[3] == "" {
			return
		}
		gid, err := strconv.ParseUint(fields[2], 10, 32)
		if err != nil {
			return
		}
		for _, m := range strings.Split(fields[3], ",") {
			if m = strings.TrimSpace(m); m != "" {
				members[m] = append(members[m], uint32(gid))
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("reading group database: %w", err)
	}
	return members, nil
}

func eachLine(r io.Reader, fn func(fields []string)) error {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		fn(strings.Split(line, ":"))
	}
	return sc.Err()
}
