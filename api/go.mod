module github.com/airlockhq/airlock/api

go 1.25
