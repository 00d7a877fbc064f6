// SPDX-License-Identifier: GPL-2.0
/*
 * ring.c — one ring per possible CPU, mapped read-only by user space
 * (sptrace_kagent.h describes the layout).  Only a traced thread in task
 * context writes, with preemption off, so each ring has one writer at a
 * time and needs no lock: an interrupt on the same CPU never writes (the
 * scope test refuses anything but task context).
 */
#include <linux/percpu.h>
#include <linux/preempt.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>
#include <asm/msr.h>

#include "kagent.h"

static void **rings;            /* nr_cpu_ids of them */
static DEFINE_PER_CPU(u64, spk_hits);

static_assert(sizeof(struct spk_ring_header) <= SPK_RING_HEADER);
static_assert(sizeof(struct spk_rec) == 16);

int spk_rings_init(void)
{
	unsigned int cpu;

	rings = kcalloc(nr_cpu_ids, sizeof *rings, GFP_KERNEL);
	if (!rings)
		return -ENOMEM;
	for_each_possible_cpu(cpu) {
		rings[cpu] = vmalloc_user(SPK_RING_BYTES);
		if (!rings[cpu]) {
			spk_rings_exit();
			return -ENOMEM;
		}
	}
	spk_rings_reset();
	return 0;
}

void spk_rings_exit(void)
{
	unsigned int cpu;

	if (!rings)
		return;
	for_each_possible_cpu(cpu)
		vfree(rings[cpu]);
	kfree(rings);
	rings = NULL;
}

void spk_rings_reset(void)
{
	unsigned int cpu;

	for_each_possible_cpu(cpu) {
		struct spk_ring_header *h = rings[cpu];

		h->magic = SPK_RING_MAGIC;
		h->version = SPK_VERSION;
		h->cpu = cpu;
		h->capacity = SPK_RING_RECS;
		WRITE_ONCE(h->count, 0);
		per_cpu(spk_hits, cpu) = 0;
	}
}

void *spk_ring_of(unsigned int cpu)
{
	return cpu < nr_cpu_ids ? rings[cpu] : NULL;
}

void spk_ring_put(u32 func)
{
	struct spk_ring_header *h;
	struct spk_rec *r;
	u64 i;

	preempt_disable();
	h = rings[smp_processor_id()];
	i = h->count;
	r = (struct spk_rec *)((char *)h + SPK_RING_HEADER) + (i & (SPK_RING_RECS - 1));
	r->tsc = rdtsc_ordered();
	r->tid = current->pid;
	r->func = func;
	smp_store_release(&h->count, i + 1);
	if (!(func & SPK_EXIT))
		this_cpu_inc(spk_hits);
	preempt_enable();
}

u64 spk_rings_hits(void)
{
	unsigned int cpu;
	u64 n = 0;

	for_each_possible_cpu(cpu)
		n += per_cpu(spk_hits, cpu);
	return n;
}
