package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// runVersion prints the module version the binary was built from: the
// release's tag for `go install …@v0.1.0`, "(devel)" with the commit for a
// build from a checkout.
func runVersion(args []string) int {
	fs := newFlags("version", "")
	if _, code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	fmt.Println(versionLine())
	return exitOK
}

func versionLine() string {
	version, commit, nats := "(devel)", "", ""
	if info, ok := debug.ReadBuildInfo(); ok {
		if info.Main.Version != "" {
			version = info.Main.Version
		}
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				commit = " " + s.Value[:12]
			}
		}
		for _, d := range info.Deps {
			if d.Path == "github.com/nats-io/nats.go" {
				nats = ", nats.go " + d.Version
			}
		}
	}
	return fmt.Sprintf("capstan %s%s (%s%s)", version, commit, runtime.Version(), nats)
}
