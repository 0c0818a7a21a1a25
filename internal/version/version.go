// Package version holds airlock's build version, set by the linker.
package version

// Version is set at build time with -ldflags "-X …/internal/version.Version=…".
var Version = "dev"
