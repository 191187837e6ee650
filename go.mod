module github.com/fitransfer/fitransfer

go 1.26.8

require (
	github.com/stretchr/testify v1.12.1
	golang.org/x/sys v0.50.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
