package template

import "github.com/airlockhq/airlock/internal/driver"

// Config is a template version's run-time configuration: what every
// sandbox of the template gets besides its layers.
type Config struct {
	// Env is merged under each sandbox's own env (ENV of the spec, or the
	// image's Env).
	Env map[string]string `json:"env,omitempty"`
	// Workdir and User are the spec's last WORKDIR and USER: the start and
	// ready commands run there and as that user.
	Workdir string `json:"workdir,omitempty"`
	User    string `json:"user,omitempty"`
	// StartCmd is started in every sandbox before it is reported ready;
	// ReadyCmd is retried until it exits 0 (both run by /bin/sh -c).
	StartCmd string `json:"start_cmd,omitempty"`
	ReadyCmd string `json:"ready_cmd,omitempty"`
	// From is the spec's FROM as written (debian:bookworm, python@2, image).
	From string `json:"from,omitempty"`
	// Lineage names the templates this one was built on, oldest first:
	// a FROM that would lead back to the template being built is a cycle.
	Lineage []string `json:"lineage,omitempty"`
}

// Resolved is a template version ready for a sandbox: the layers a driver
// stacks and the run-time config.
type Resolved struct {
	driver.Template
	// ID is the version's id (tpl_…).
	ID string
	// Tenant owns the template; "" for the shipped ones.
	Tenant string
	Config Config
}
