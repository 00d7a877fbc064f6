/*
 * ipmark.c — the IP option that marks a traced UDP datagram, and the probe
 * that goes before it (agent/propagate.c, points 12 to 14; spdaemon/inject.c,
 * the probe): one layout for the agent that writes and reads it and the
 * daemons that probe with it.
 */
#include <string.h>

#include "sp.h"

void sp_ipmark_build(uint8_t o[SP_IPMARK_LEN], uint32_t seq)
{
	o[0] = 7;                       /* IPOPT_RR: any host may send it */
	o[1] = 11;
	o[2] = 12;                      /* its pointer past its end: full, no router writes */
	memcpy(o + 3, "SPTR", 4);
	o[7] = (uint8_t)(seq >> 24), o[8] = (uint8_t)(seq >> 16);
	o[9] = (uint8_t)(seq >> 8), o[10] = (uint8_t)seq;
	o[11] = 0;                      /* IPOPT_END */
}

int sp_ipmark_find(const uint8_t *p, size_t n, uint32_t *seq)
{
	for (size_t i = 0; i < n && p[i] != 0;) {
		if (p[i] == 1) {                /* IPOPT_NOOP */
			i++;
			continue;
		}
		if (i + 1 >= n || p[i + 1] < 2 || i + p[i + 1] > n)
			return 0;
		if (p[i] == 7 && p[i + 1] == 11 && memcmp(p + i + 3, "SPTR", 4) == 0) {
			*seq = (uint32_t)p[i + 7] << 24 | (uint32_t)p[i + 8] << 16 |
			       (uint32_t)p[i + 9] << 8 | p[i + 10];
			return 1;
		}
		i += p[i + 1];
	}
	return 0;
}
