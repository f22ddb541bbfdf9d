// The TypeScript client, not Go code: a module of its own keeps the
// repository's `go build ./...`, `go vet ./...` and `go test ./...` out of
// its node_modules, where some npm packages carry Go sources.
module github.com/capstan-dev/capstan/clients/typescript

go 1.26
