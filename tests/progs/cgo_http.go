// cgo_http.go — a Go net/http server with cgo, for sptrace attach
// (tests/e2e/test_attach.py, go-cgo).  Its threads wait in futex and
// epoll_pwait made from the Go runtime's own code, never the C library's.
// It prints its port, then answers every request with 42, computed in C.
package main

/*
static int add(int a, int b) { return a + b; }
*/
import "C"

import (
	"fmt"
	"net"
	"net/http"
	"os"
)

func main() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().(*net.TCPAddr).Port)
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%d\n", int(C.add(40, 2)))
	})
	http.Serve(ln, nil)
}
