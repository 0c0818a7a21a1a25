package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// maxJSONBody bounds every JSON request body: the largest legitimate one (a
// create with env, secrets and metadata at their limits) is far below it.
const maxJSONBody = 1 << 20

// decodeJSON reads r's body into dst: at most maxJSONBody bytes, unknown
// fields refused, one JSON value and nothing after it. An empty body is
// accepted (dst keeps its zero value) when allowEmpty.
func decodeJSON(w http.ResponseWriter, r *http.Request, dst any, allowEmpty bool) error {
	if r.ContentLength > maxJSONBody {
		// Decided from the header, before reading a byte.
		return errf(errdefs.ErrTooLarge, fmt.Sprintf("request body exceeds %d bytes", maxJSONBody))
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		// The body must be JSON whatever it is labelled; the label is only
		// refused when it says the body is something else. curl -d labels
		// JSON as a form, and text/plain is common: both are accepted.
		mt, _, _ := strings.Cut(ct, ";")
		switch mt = strings.TrimSpace(strings.ToLower(mt)); {
		case mt == "application/json", strings.HasSuffix(mt, "+json"), mt == "text/plain",
			mt == "application/x-www-form-urlencoded":
		default:
			return errf(errdefs.ErrInvalidArgument, "content-type must be application/json")
		}
	}
	body := http.MaxBytesReader(w, r.Body, maxJSONBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		if errors.Is(err, io.EOF) && allowEmpty {
			return nil
		}
		return jsonError(err)
	}
	// One value only: trailing garbage is a malformed body, not ignorable.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return errf(errdefs.ErrInvalidArgument, "malformed json: unexpected data after the body")
	}
	return nil
}

// jsonError turns a decoding error into a client-safe one.
func jsonError(err error) error {
	var (
		syn *json.SyntaxError
		typ *json.UnmarshalTypeError
		mbe *http.MaxBytesError
	)
	switch {
	case errors.As(err, &mbe):
		return err
	case errors.Is(err, io.EOF):
		return errf(errdefs.ErrInvalidArgument, "request body is empty")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errf(errdefs.ErrInvalidArgument, "malformed json: unexpected end of body")
	case errors.As(err, &syn):
		return errf(errdefs.ErrInvalidArgument, fmt.Sprintf("malformed json at byte %d: %s", syn.Offset, syn.Error()))
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "body"
		}
		return errf(errdefs.ErrInvalidArgument, fmt.Sprintf("field %s must be %s, not %s", field, typ.Type.String(), typ.Value))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return errf(errdefs.ErrInvalidArgument, "unknown field "+strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return errf(errdefs.ErrInvalidArgument, "malformed json")
}

// queryInt parses an optional integer query parameter.
func queryInt(r *http.Request, name string, def int) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, errf(errdefs.ErrInvalidArgument, name+" must be an integer")
	}
	return n, nil
}

// queryBool parses an optional boolean query parameter.
func queryBool(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errf(errdefs.ErrInvalidArgument, name+" must be true or false")
	}
	return b, nil
}
