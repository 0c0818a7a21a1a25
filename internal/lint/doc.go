// Package lint holds repository-wide checks that run with the test suite.
package lint
