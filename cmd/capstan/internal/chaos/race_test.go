//go:build race

package chaos

// raceBuild is true when the tests run with the race detector: the capstan
// binary they start is built with it too.
const raceBuild = true
