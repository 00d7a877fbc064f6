// cgo_gc.go — a Go program with cgo for test_runtimes.py: 8 goroutines call a C
// function (malloc, snprintf, strlen, free) while Go allocates (so the GC
// scans their stacks), then a forced GC; prints a total and exits 3.
package main

/*
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long c_work(long n) {
	long s = 0;
	for (long i = 0; i < n; i++) {
		char *p = malloc(64);
		snprintf(p, 64, "%ld", i);
		s += (long)strlen(p);
		free(p);
	}
	return s;
}
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"sync"
)

func main() {
	var wg sync.WaitGroup
	sums := make([]int64, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			var keep [][]byte
			for i := 0; i < 200; i++ {
				keep = append(keep, make([]byte, 4096))
				sums[g] += int64(C.c_work(C.long(50)))
			}
			sums[g] += int64(len(keep))
		}(g)
	}
	wg.Wait()
	runtime.GC()
	var total int64
	for _, s := range sums {
		total += s
	}
	fmt.Println("total", total)
	os.Exit(3)
}
