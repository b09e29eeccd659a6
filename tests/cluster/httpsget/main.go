// https-get: a static HTTPS client for the real node's test image (busybox's TLS cannot talk
// to the Go API server). Prints the status and the body; exits 1 on any error or status >= 400.
//
//	https-get [-cacert FILE] [-token FILE] [-insecure] URL
package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	cacert := flag.String("cacert", "", "PEM file of the CA that signed the server's certificate")
	token := flag.String("token", "", "file with a bearer token")
	insecure := flag.Bool("insecure", false, "do not verify the server's certificate")
	timeout := flag.Duration("timeout", 10*time.Second, "whole request timeout")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: https-get [-cacert FILE] [-token FILE] [-insecure] URL")
		os.Exit(2)
	}
	cfg := &tls.Config{InsecureSkipVerify: *insecure}
	if *cacert != "" {
		pem, err := os.ReadFile(*cacert)
		if err != nil {
			fail(err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			fail(fmt.Errorf("no certificate in %s", *cacert))
		}
		cfg.RootCAs = pool
	}
	req, err := http.NewRequest(http.MethodGet, flag.Arg(0), nil)
	if err != nil {
		fail(err)
	}
	if *token != "" {
		t, err := os.ReadFile(*token)
		if err != nil {
			fail(err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(t)))
	}
	client := &http.Client{Timeout: *timeout, Transport: &http.Transport{TLSClientConfig: cfg}}
	resp, err := client.Do(req)
	if err != nil {
		fail(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("HTTP %d\n%s\n", resp.StatusCode, body)
	if resp.StatusCode >= 400 {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "https-get:", err)
	os.Exit(1)
}
