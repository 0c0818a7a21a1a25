// Package escape is airlock's escape and abuse suite: hostile programs run in sandboxes of a real daemon, and each asserts containment, an unaffected host and an unaffected neighbouring sandbox.
//
// The package holds only tests. They drive `airlock serve` in-process
// (daemon.Run on 127.0.0.1:0 with a temp data dir and the shared template
// cache, AIRLOCK_TEST_DATA_DIR), talk to it over HTTP with the Go SDK, and
// run every attack against every runtime the daemon reports healthy
// (AIRLOCK_ESCAPE_RUNTIMES=runc,gvisor narrows or widens the list). They need
// root and runc and skip with the reason elsewhere.
//
// Each attack is one subtest:
//
//	go test -race -run 'TestEscape/runc/Syscalls' ./test/escape/
//
// A subtest passes when the attack fails the expected way (EPERM, EROFS,
// ENOENT, killed, limited), the host is unchanged (a world-readable marker
// file, a host process, mounts, loop devices, host sysctls, processes of the
// sandbox's uid range outside its namespaces) and the neighbouring sandbox's
// canary still advances with its files intact. docs/security.md maps every
// subtest to the layer that stops it.
package escape
