//go:build !race

package testenv_test

const raceEnabled = false
