// Package pkgcache is airlock's pull-through package cache: a registry mirror (PyPI, npm, Go module proxy, Debian) that sandboxes' package managers use over plain HTTP on their gateway, fetching upstream over HTTPS once per artifact, auditing each package and enforcing each sandbox's download cap.
//
// Only immutable artifacts are stored (wheels and sdists, npm tarballs,
// module zips, .deb pool files), keyed by their upstream URL, on disk under
// a size bound with least-recently-used eviction. Index pages and metadata
// pass through every time, with their links rewritten to the mirror.
// Concurrent fetches of one artifact are coalesced into one upstream
// request.
package pkgcache

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// Store is a size-bounded on-disk cache of immutable blobs keyed by string
// (an upstream URL). It is safe for concurrent use.
type Store struct {
	dir string
	max int64

	mu      sync.Mutex
	entries map[string]*list.Element // file name → element of lru (value *entry)
	lru     *list.List               // front: most recently used
	size    int64
	flight  map[string]*call
}

type entry struct {
	name string
	size int64
}

// call is one fetch in flight; waiters block on done.
type call struct {
	done chan struct{}
	err  error
}

// OpenStore opens (creating) the store in dir, bounded to maxBytes. Blobs a
// previous daemon left are kept, oldest-modified evicted first.
func OpenStore(dir string, maxBytes int64) (*Store, error) {
	if maxBytes <= 0 {
		return nil, errors.New("package cache size must be positive")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating package cache: %w", err)
	}
	s := &Store{dir: dir, max: maxBytes, entries: map[string]*list.Element{}, lru: list.New(), flight: map[string]*call{}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading package cache: %w", err)
	}
	type old struct {
		name string
		size int64
		mod  time.Time
	}
	var olds []old
	for _, e := range ents {
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		if len(e.Name()) != 64 { // partial downloads (".tmp-…") and strays
			_ = os.Remove(filepath.Join(dir, e.Name()))
			continue
		}
		olds = append(olds, old{e.Name(), info.Size(), info.ModTime()})
	}
	sort.Slice(olds, func(i, j int) bool { return olds[i].mod.Before(olds[j].mod) })
	for _, o := range olds {
		s.entries[o.name] = s.lru.PushFront(&entry{o.name, o.size})
		s.size += o.size
	}
	s.mu.Lock()
	s.evictLocked()
	s.mu.Unlock()
	return s, nil
}

func fileName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Size returns the bytes stored.
func (s *Store) Size() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size
}

// Open returns the blob of key and its size, marking it recently used; ok
// is false when it is not stored. The file stays readable even if it is
// evicted while open.
func (s *Store) Open(key string) (f *os.File, size int64, ok bool) {
	name := fileName(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.entries[name]
	if !ok {
		return nil, 0, false
	}
	f, err := os.Open(filepath.Join(s.dir, name))
	if err != nil {
		s.removeLocked(el)
		return nil, 0, false
	}
	s.lru.MoveToFront(el)
	return f, el.Value.(*entry).size, true
}

// Fill stores key's blob by calling fetch, unless it is stored already or
// another Fill of key is under way, in which case it waits for that one.
// fetch writes the blob to w; an error discards it. fetched reports
// whether this call ran fetch. A blob larger than the store is fetched but
// not kept (Open then misses; the caller falls back to passing it through).
func (s *Store) Fill(ctx context.Context, key string, fetch func(ctx context.Context, w io.Writer) error) (fetched bool, err error) {
	name := fileName(key)
	s.mu.Lock()
	if _, ok := s.entries[name]; ok {
		s.mu.Unlock()
		return false, nil
	}
	if c, ok := s.flight[name]; ok {
		s.mu.Unlock()
		select {
		case <-c.done:
			return false, c.err
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	c := &call{done: make(chan struct{})}
	s.flight[name] = c
	s.mu.Unlock()

	c.err = s.fill(ctx, name, fetch)
	s.mu.Lock()
	delete(s.flight, name)
	s.mu.Unlock()
	close(c.done)
	return true, c.err
}

func (s *Store) fill(ctx context.Context, name string, fetch func(ctx context.Context, w io.Writer) error) error {
	tmp, err := os.CreateTemp(s.dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("package cache: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	ferr := fetch(ctx, tmp)
	info, serr := tmp.Stat()
	cerr := tmp.Close()
	if err := errors.Join(ferr, serr, cerr); err != nil {
		return err
	}
	if info.Size() > s.max {
		return nil
	}
	path := filepath.Join(s.dir, name)
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("package cache: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entries[name] = s.lru.PushFront(&entry{name, info.Size()})
	s.size += info.Size()
	s.evictLocked()
	return nil
}

// evictLocked drops least recently used blobs until the store fits.
func (s *Store) evictLocked() {
	for s.size > s.max {
		el := s.lru.Back()
		if el == nil {
			return
		}
		s.removeLocked(el)
	}
}

func (s *Store) removeLocked(el *list.Element) {
	e := el.Value.(*entry)
	s.lru.Remove(el)
	delete(s.entries, e.name)
	s.size -= e.size
	if err := os.Remove(filepath.Join(s.dir, e.name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		// Accounted as gone either way: the next OpenStore removes
		// nothing it cannot read.
		return
	}
}
