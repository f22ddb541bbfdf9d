package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// Ports are chosen below the kernel's ephemeral range. A port the kernel
// handed out for ":0" is free only until the listener closes: every outgoing
// connection of every process takes its local port from that same range, and
// under a parallel suite one of them took a port between the check and the
// server's bind ("address already in use"). Below the range only another
// process choosing ports deliberately can take it, and each process starts at
// a random point of a wide span and walks it in order.
const (
	lowestPort       = 10000
	defaultEphemeral = 32768
)

var (
	portSpan = ephemeralLow() - lowestPort
	nextPort atomic.Int64
)

func init() { nextPort.Store(rand.Int64N(int64(portSpan))) }

// FreePort returns a loopback TCP port nothing listens on, outside the range
// the kernel draws ephemeral ports from, for a process a test starts that must
// be told its port in advance. Ports are never returned twice by one process.
func FreePort(t testing.TB) int {
	t.Helper()
	return FreePorts(t, 1)[0]
}

// FreePorts returns n distinct ports as FreePort does.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries > portSpan {
			t.Fatalf("testenv: no free loopback port in %d..%d", lowestPort, lowestPort+portSpan)
		}
		port := lowestPort + int(nextPort.Add(1)%int64(portSpan))
		if portFree(port) {
			ports = append(ports, port)
		}
	}
	return ports
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// ephemeralLow is the first port of the kernel's ephemeral range where the
// system says (Linux); the IANA range's start elsewhere.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return defaultEphemeral
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return defaultEphemeral
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil || low <= lowestPort+1000 {
		return defaultEphemeral
	}
	return low
}
