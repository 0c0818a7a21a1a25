package sandbox

import (
	"maps"
)

// mergeEnv layers the request's env over the template's.
func mergeEnv(tmpl, req map[string]string) map[string]string {
	if len(tmpl) == 0 {
		return req
	}
	out := maps.Clone(tmpl)
	maps.Copy(out, req)
	return out
}
