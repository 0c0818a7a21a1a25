package store

import (
	"encoding/base64"
	"encoding/json"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// cursor is the position after the last row of a page: rows are ordered by
// (time, id) descending, so the next page starts strictly below it. Clients
// get it base64url-encoded and must treat it as opaque.
type cursor struct {
	T  int64  `json:"t"`
	ID string `json:"i"`
}

func encodeCursor(c cursor) string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (cursor, error) {
	var c cursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) > 512 {
		return c, errdefs.Wrap(errdefs.ErrInvalidArgument, "invalid cursor")
	}
	if err := json.Unmarshal(b, &c); err != nil || c.ID == "" {
		return c, errdefs.Wrap(errdefs.ErrInvalidArgument, "invalid cursor")
	}
	return c, nil
}
