package e2b

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// Signed file URLs: the SDKs' downloadUrl and uploadUrl give a URL to
// anyone (a browser, curl) that reads or writes one file of a sandbox
// without its access token: /files?path=…&username=…&signature=v1_…
// [&signature_expiration=<unix s>], where the signature is
// "v1_" + base64(sha256("path:operation:user:<envd access token>[:expiration]"))
// without padding, operation "read" (GET) or "write" (POST). Such a URL
// carries no routing header when the SDK builds it on E2B_SANDBOX_URL, so
// the plane finds the sandbox whose token verifies it.

// IsSignedFiles reports whether r is a signed /files call (see above).
func IsSignedFiles(r *http.Request) bool {
	return r.URL.Path == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodPost) &&
		r.URL.Query().Get("signature") != ""
}

// fileSignature is the signature of a /files URL for the sandbox whose
// envd access token is token.
func fileSignature(p, operation, user, token, expiration string) string {
	raw := p + ":" + operation + ":" + user + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

// serveSigned serves a signed /files call: the sandbox named by the
// routing header, or else the one live sandbox whose token verifies the
// signature (every live sandbox is tried, so the time taken does not tell
// which matched), then the expiration. A verified call is served as if it
// carried the sandbox's access token: it reads or writes the one path, as
// the one user, that the signature covers.
func (h *Handler) serveSigned(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	sig, exp := q.Get("signature"), q.Get("signature_expiration")
	candidates := []string{r.Header.Get(HeaderSandboxID)}
	if candidates[0] == "" {
		candidates = candidates[:0]
		for _, sb := range h.sandboxes.Lives() {
			candidates = append(candidates, sb.ID())
		}
	}
	found := ""
	for _, id := range candidates {
		want := fileSignature(q.Get("path"), op, q.Get("username"), h.AccessToken(id), exp)
		if subtle.ConstantTimeCompare([]byte(sig), []byte(want)) == 1 && found == "" {
			found = id
		}
	}
	if found == "" {
		err := errf(errdefs.ErrUnauthenticated, "invalid signature")
		h.authFailed(r, err, "sandbox plane")
		writeJSON(w, http.StatusUnauthorized, errorBody{Code: http.StatusUnauthorized, Message: "invalid signature"})
		return
	}
	if exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, errorBody{Code: http.StatusBadRequest, Message: "invalid signature_expiration"})
			return
		}
		if time.Now().Unix() > n {
			writeJSON(w, http.StatusUnauthorized, errorBody{Code: http.StatusUnauthorized, Message: "signature is already expired"})
			return
		}
	}
	r = r.Clone(r.Context())
	r.Header.Set(HeaderSandboxID, found)
	r.Header.Del(HeaderSandboxPort)
	r.Header.Del(HeaderTrafficToken)
	r.Header.Set(HeaderAccessToken, h.AccessToken(found))
	h.serveSandbox(w, r)
}
