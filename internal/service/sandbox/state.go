package sandbox

import (
	"fmt"
	"slices"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/internal/errdefs"
)

// transitions is the sandbox state machine: every legal move, in one place.
//
//	starting ─▶ running ⇄ paused
//	   │           │        │
//	   ├───────────┴────────┴─▶ stopping ─▶ stopped
//	   └──────────────────────▶ error ─────▶ stopped
//
// Any live state may fall into error (a crash, a failed create); an error
// sandbox whose cleanup failed goes through stopping again when deleted.
// stopped is final.
var transitions = map[string]map[string]bool{
	api.StateStarting: {api.StateRunning: true, api.StateStopping: true, api.StateError: true},
	api.StateRunning:  {api.StatePaused: true, api.StateStopping: true, api.StateError: true},
	api.StatePaused:   {api.StateRunning: true, api.StateStopping: true, api.StateError: true},
	api.StateStopping: {api.StateStopped: true, api.StateError: true},
	api.StateError:    {api.StateStopping: true, api.StateStopped: true},
	api.StateStopped:  {},
}

// errIllegalTransition marks a bug: code asked for a move the state machine
// does not allow. Callers check preconditions (and answer invalid_state)
// before they transition, so this never reaches a client as anything but
// an internal error.
var errIllegalTransition = fmt.Errorf("%w: illegal sandbox state transition", errdefs.ErrInternal)

// checkTransition returns nil if from → to is legal.
func checkTransition(from, to string) error {
	if next, ok := transitions[from]; ok && next[to] {
		return nil
	}
	return fmt.Errorf("%w: %s → %s", errIllegalTransition, from, to)
}

// isGone reports whether the sandbox stopped being live.
func (sb *Live) isGone() bool {
	select {
	case <-sb.gone:
		return true
	default:
		return false
	}
}

// isLive reports whether a sandbox in state may hold runtime resources.
func isLive(state string) bool {
	switch state {
	case api.StateStarting, api.StateRunning, api.StatePaused, api.StateStopping:
		return true
	}
	return false
}

// LiveStates are the states of a live sandbox, counted against capacity
// and quotas.
func LiveStates() []string { return slices.Clone(liveStates) }

// liveStates are the states counted against capacity and quotas.
var liveStates = []string{api.StateStarting, api.StateRunning, api.StatePaused, api.StateStopping}
