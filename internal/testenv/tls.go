package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TLSFiles are the PEM files of a client of a server started with
// MutualTLS: the root that signed the server's certificate, and a client
// certificate and key the server accepts.
type TLSFiles struct {
	// CA is the root certificate both the server's and the client's
	// certificates are signed by.
	CA string
	// Cert and Key are the client's certificate and private key.
	Cert, Key string
}

// MutualTLS is a server option that speaks only TLS and refuses a client
// without a certificate signed by a root made for the test, and the files a
// client needs. Everything is made fresh under t.TempDir().
func MutualTLS(t testing.TB) (Option, TLSFiles) {
	t.Helper()
	dir := t.TempDir()
	caKey, ca := newCert(t, nil, nil, &x509.Certificate{
		Subject: pkix.Name{CommonName: "capstan test root"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	})
	serverKey, server := newCert(t, ca, caKey, &x509.Certificate{
		Subject: pkix.Name{CommonName: "127.0.0.1"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	clientKey, client := newCert(t, ca, caKey, &x509.Certificate{
		Subject:  pkix.Name{CommonName: "capstan test client"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	files := TLSFiles{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "client.pem"), Key: filepath.Join(dir, "client-key.pem")}
	writePEM(t, files.CA, "CERTIFICATE", ca.Raw)
	writePEM(t, files.Cert, "CERTIFICATE", client.Raw)
	writePEM(t, files.Key, "EC PRIVATE KEY", marshalKey(t, clientKey))
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	cfg := &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{server.Raw}, PrivateKey: serverKey, Leaf: server}},
		ClientAuth:   tls.RequireAndVerifyClientCert, ClientCAs: roots, MinVersion: tls.VersionTLS12,
	}
	return func(o *options) { o.TLS = cfg }, files
}

// ClientTLS is a client's TLS configuration with the certificate and key of
// f: what a program that connects to a MutualTLS server puts in
// executor.ConnectOptions.TLS.
func (f TLSFiles) ClientTLS(t testing.TB) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

// newCert makes a certificate from tmpl with a fresh P-256 key, signed by
// parent's key (self-signed when parent is nil).
func newCert(t testing.TB, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, tmpl *x509.Certificate) (*ecdsa.PrivateKey, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert
}

func marshalKey(t testing.TB, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
