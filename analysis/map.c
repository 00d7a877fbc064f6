/*
 * map.c — a small hash map: (a, b) -> uint32, for function identities and
 * the open calls of a thread. Declared in an_internal.h.
 */
#include "an_internal.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* A small hash map: (a, b) -> uint32, for function identities and the open */
/* calls of each site.                                                      */
/* ------------------------------------------------------------------------ */


static size_t map_hash(uint64_t a, uint64_t b)
{
	uint64_t h = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull) * 0xc2b2ae3d27d4eb4full;

	return (size_t)(h ^ (h >> 29));
}

map_slot *an_map_find(const map *m, uint64_t a, uint64_t b)
{
	if (!m->cap)
		return NULL;
	for (size_t i = map_hash(a, b) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
		if (!m->slot[i].used)
			return NULL;
		if (m->slot[i].a == a && m->slot[i].b == b)
			return &m->slot[i];
	}
}

/* The slot for (a, b), created with val 0 if new; NULL when out of memory. */
map_slot *an_map_get(map *m, uint64_t a, uint64_t b)
{
	map_slot *s = an_map_find(m, a, b);

	if (s)
		return s;
	if ((m->n + 1) * 2 > m->cap) {
		size_t ncap = m->cap ? m->cap * 2 : 16;
		map_slot *ns = calloc(ncap, sizeof *ns);

		if (!ns)
			return NULL;
		for (size_t i = 0; i < m->cap; i++) {
			if (!m->slot[i].used)
				continue;
			size_t j = map_hash(m->slot[i].a, m->slot[i].b) & (ncap - 1);
			while (ns[j].used)
				j = (j + 1) & (ncap - 1);
			ns[j] = m->slot[i];
		}
		free(m->slot);
		m->slot = ns;
		m->cap = ncap;
	}
	size_t i = map_hash(a, b) & (m->cap - 1);
	while (m->slot[i].used)
		i = (i + 1) & (m->cap - 1);
	m->slot[i] = (map_slot){ a, b, 0, 1 };
	m->n++;
	return &m->slot[i];
}

uint64_t an_hash_str(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;          /* FNV-1a */

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
	return h;
}

void an_map_free(map *m)
{
	free(m->slot);
	m->slot = NULL;
	m->cap = m->n = 0;
}

