/* The hot reuse loop in C, for a program run through the preload or not: `hot_threads SIZE SECONDS
 * [m|c] [THREADS]` runs THREADS threads (default 2), each looping `p = malloc(n)` (or `calloc`),
 * `memset(p, 7, n)`, `free(p)` with n uniform in [SIZE/2, SIZE], for SECONDS; each prints its calls
 * per second and how often it got back the block it had just freed. Build: `gcc -O2 -pthread`. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static size_t size; static double dur; static int zero;
static void*run(void*arg){ long id=(long)arg; uint64_t x=0x9e3779b97f4a7c15ULL+id*977; long calls=0,same=0; void*last=0; double t0=now();
  while(now()-t0<dur){ for(int k=0;k<8;k++){
    x^=x<<13;x^=x>>7;x^=x<<17; size_t len=size/2+x%(size/2+1);
    char*p=zero?calloc(1,len):malloc(len); if(!p)exit(1); memset(p,7,len); __asm__ volatile("" :: "r"(p) : "memory"); if(p==last)same++; last=p; free(p); calls++; } }
  double t=now()-t0; printf("thread %ld: %.0f calls/s, same block %.1f%%\n",id,calls/t,100.0*same/calls); return 0;}
int main(int argc,char**argv){ size=strtoul(argv[1],0,0); dur=atof(argv[2]); zero=argc>3&&argv[3][0]=='c'; int nt=argc>4?atoi(argv[4]):2;
 pthread_t t[8]; for(long i=0;i<nt;i++)pthread_create(&t[i],0,run,(void*)i); for(int i=0;i<nt;i++)pthread_join(t[i],0); return 0;}
