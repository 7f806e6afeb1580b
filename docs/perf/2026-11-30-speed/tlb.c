// Per guest hugepage: cycles an access when chasing one line in each of its 512 4 KiB
// sub-pages with the data in cache and the TLB cold: ~L2 latency if the host maps the
// 2 MiB page with one large page (one TLB entry covers it), far more if with 4 KiB pages.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <sys/mman.h>
#include <x86intrin.h>
#define HP (2UL<<20)
int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 256;
  char *m = mmap(0, n*HP, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_HUGETLB|MAP_POPULATE, -1, 0);
  if (m == MAP_FAILED) { perror("mmap"); return 1; }
  size_t ev = 64UL<<20; char *e = mmap(0, ev, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_POPULATE, -1, 0);
  madvise(e, ev, MADV_NOHUGEPAGE);
  for (size_t i = 0; i < ev; i += 4096) e[i] = 1;
  int ord[512]; unsigned x = 12345;
  for (int p = 0; p < n; p++) {
    char *b = m + p*HP;
    for (int i = 0; i < 512; i++) ord[i] = i;
    for (int i = 511; i > 0; i--) { x = x*1103515245+12345; int j = (x>>8) % (i+1); int t = ord[i]; ord[i] = ord[j]; ord[j] = t; }
    for (int i = 0; i < 512; i++) {
      char *a = b + ord[i]*4096 + (ord[i]%64)*64;
      char *nx = b + ord[(i+1)%512]*4096 + (ord[(i+1)%512]%64)*64;
      *(char**)a = nx;
    }
    uint64_t best = ~0ULL;
    for (int rep = 0; rep < 5; rep++) {
      char *q = b + ord[0]*4096 + (ord[0]%64)*64;
      for (int i = 0; i < 512; i++) q = *(char**)q;  // warm the lines
      volatile char s = 0;
      for (size_t i = 0; i < ev; i += 4096) s += e[i];  // evict the TLB (16k 4 KiB pages)
      for (int i = 0; i < 512; i++) q = *(char**)q;  // warm the lines again (cheap if in L2)
      for (size_t i = 0; i < ev; i += 4096) s += e[i];
      uint64_t t0 = __rdtsc();
      for (int i = 0; i < 512; i++) q = *(char**)q;
      uint64_t t = __rdtsc() - t0;
      if (q == 0) puts("");
      if (t < best) best = t;
    }
    printf("%d %.1f\n", p, best / 512.0);
  }
  return 0;
}
