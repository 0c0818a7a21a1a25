module github.com/airlockhq/airlock/client

go 1.25

require (
	github.com/airlockhq/airlock/api v0.1.0
	github.com/coder/websocket v1.8.15
)

replace github.com/airlockhq/airlock/api => ../api
