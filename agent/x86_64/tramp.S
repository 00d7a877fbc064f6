/*
 * tramp.S — the code the patch areas call (the record stubs and the other
 * stubs, below) and the ways generated code enters the agent's C code.
 *
 * ag_tramp_slow: called from a stub with r11 = the request.  Saves the
 * flags, every general register and the complete XSAVE state (x87, SSE, AVX
 * upper halves, AVX-512, ...), calls ag_slow(request) on a 64-byte aligned
 * stack, restores everything but r11, which carries ag_slow's answer (r11 is
 * dead at a call site), and returns into the stub.  The program can never
 * tell a slow path ran.  A thread in the agent's own code (ag_tls_busy: the
 * C library calls it makes, hundreds in a forked child's handlers) or a
 * quiet one (tsc.c: no system call, no record) gets "skip" (0) at once,
 * without the save.
 *
 * ag_tramp_return: the root function (where tracing began on this thread)
 * returns here instead of to its caller.  It records the exit, asks the
 * agent for the real return address and jumps there with the return values
 * intact.
 *
 * ag_tramp_retpoint: a return stub (activate.c) jumps here with r11 = its
 * slot.  Like ag_tramp_return, with ag_retpoint(slot) naming the real
 * return address.  (r11 is free at a return point: the ABI lets a callee
 * clobber it.)
 */
	.text

/* agent.h: the slow-path requests, the slots' layout, the layout of
 * ag_indirect_site and the ring header's offsets (checked by static
 * assertions in emit.c and instrument.c). */
#define AG_SLOW_RING 1
#define AG_SLOW_INSTRUMENT 2
#define AG_SLOW_SYNC 3
#define AG_SLOW_INDIRECT 4
#define AG_SLOW_ROTATE 5
#define AG_SLOT_SMALL 128
#define AG_SLOT_BIG 256
#define AG_SLOT_REF 32
#define AG_BUDGET_SITES (1 << 19)
#define IS_CACHE 16
#define IS_KNOWN_IDS 24
#define IS_KNOWN_TARGETS 56
#define RING_COUNT 24
#define RING_MASK 32
#define RING_EPOCH 40
#define RING_LIMIT 88

.macro SAVE_ALL
	pushfq
	push	%rax
	push	%rcx
	push	%rdx
	push	%rbx
	push	%rsi
	push	%rdi
	push	%r8
	push	%r9
	push	%r10
	push	%r11
	push	%rbp
	mov	%rsp, %rbp
	mov	ag_xsave_size(%rip), %rax
	sub	%rax, %rsp
	and	$-64, %rsp
	/* XRSTOR faults on a non-zero reserved header: clear bytes 512..575. */
	xor	%eax, %eax
	mov	%rax, 512(%rsp)
	mov	%rax, 520(%rsp)
	mov	%rax, 528(%rsp)
	mov	%rax, 536(%rsp)
	mov	%rax, 544(%rsp)
	mov	%rax, 552(%rsp)
	mov	%rax, 560(%rsp)
	mov	%rax, 568(%rsp)
	mov	$-1, %eax
	mov	$-1, %edx
	xsave	(%rsp)
.endm

.macro RESTORE_ALL
	mov	$-1, %eax
	mov	$-1, %edx
	xrstor	(%rsp)
	mov	%rbp, %rsp
	pop	%rbp
	pop	%r11
	pop	%r10
	pop	%r9
	pop	%r8
	pop	%rdi
	pop	%rsi
	pop	%rbx
	pop	%rdx
	pop	%rcx
	pop	%rax
	popfq
.endm

/*
 * The record calls (x86_64/emit.c): an area records with
 *
 *	movq $WORD,-64(%rsp); call *stub(%rip)
 *
 * where the stub's address is a word of the pool's data.  At the call the
 * area has the call site's stack pointer S, under which the red zone is dead
 * (see emit.c); the stub runs with rsp = S - 8, so its offsets below are
 * S's less 8:
 *
 *   S-16 rax   S-24 rdx   S-32 r11   (spilled, restored at the end)
 *   S-40       an indirect area's target: never touched here
 *   S-48       the flags (exit and value records)
 *   S-56       the ring header, across a move slow path
 *   S-64       WORD: id << 2 | kind, or a value record's id word
 *   S-72       a value record's value
 *
 * Every register and flag is as it was when the stub returns.  The slow
 * paths call ag_tramp_slow 128 bytes below S, so the spills survive it:
 *   no_ring: the thread has no ring (yet): ask; retry or skip
 *   sync:    the TSC's high bits changed: ask (the SYNC record); retry/skip
 *   move:    a file that keeps every record reached its window's end: ask
 *            with the record's index; store (its slot is mapped) or skip
 * A record of the ring is the writer side of trace_format.h:
 *   rdtsc; tsc << 26 | WORD; slot = xadd COUNT; ring[slot & MASK] = record
 * The slot is taken with one instruction: a signal handler that records on
 * this thread in between gets the next slots, never ours.
 *
 * These run in the agent's text, so a thread interrupted in one is "in the
 * agent" (activate.c, tsc.c); their CFI lets an unwinder step back into the
 * area, and from there (unwind.c) to the caller.
 */
/* A stub's symbol and its CFI (the end: STUB_END). */
.macro STUB name
	.p2align 4
	.globl	\name
	.hidden	\name
	.type	\name, @function
\name:
	.cfi_startproc
	endbr64
.endm

.macro STUB_END name
	.cfi_endproc
	.size	\name, .-\name
.endm

/* ag_tramp_slow with the request in r11, called 128 bytes below S. */
.macro CALL_SLOW
	lea	-120(%rsp), %rsp
	.cfi_adjust_cfa_offset 120
	call	ag_tramp_slow
	lea	120(%rsp), %rsp
	.cfi_adjust_cfa_offset -120
.endm

.macro SLOW_CALL req
	mov	$(\req << 56), %r11
	CALL_SLOW
.endm

/* The move slow path (rax the record, rdx its index, r11 the header; the
 * trampoline keeps rax and rdx): store at 2b if the answer says so, then
 * to the restores at 3b. */
.macro MOVE
7:	mov	%r11, -48(%rsp)
	movabs	$(AG_SLOW_ROTATE << 56), %r11
	or	%rdx, %r11
	CALL_SLOW
	test	%r11, %r11
	mov	-48(%rsp), %r11
	jne	2b
	jmp	3b
.endm

/* One record stub: \\flags keeps the flags (after a call they are the
 * callee's result, which code with a private convention may use).  With
 * \\value, a value record (trace_format.h, "Values"): the value at S-72 in
 * place of the TSC, so no sync slow path; and no ring slow path either: the
 * ENTRY just before made the thread's ring if it could, and without one it
 * was skipped too, so the value is skipped with it.
 *   record = value << 26 | (value >> 25 & 0x1fff << 13) | WORD */
.macro RECORD name, flags, value=0
	STUB	\name
	mov	%rax, -8(%rsp)
	mov	%rdx, -16(%rsp)
	mov	%r11, -24(%rsp)
	.if \flags
	lahf
	seto	%al
	mov	%ax, -40(%rsp)
	.endif
1:	movq	ag_tls_ring@gottpoff(%rip), %r11
	movq	%fs:(%r11), %r11		/* the thread's ring, NULL if none (yet) */
	test	%r11, %r11
	.if \value
	je	3f
	mov	-64(%rsp), %rax			/* the value */
	mov	%rax, %rdx
	shl	$26, %rax
	shr	$25, %rdx
	and	$0x3ffe000, %edx
	or	%rdx, %rax
	.else
	je	5f
	rdtsc
	shl	$32, %rdx
	or	%rdx, %rax
	mov	%rax, %rdx
	shr	$38, %rdx
	cmp	RING_EPOCH(%r11), %rdx
	jne	6f
	shl	$26, %rax
	.endif
	or	-56(%rsp), %rax			/* WORD */
	mov	$1, %edx
	xadd	%rdx, RING_COUNT(%r11)
	cmp	RING_LIMIT(%r11), %rdx
	jae	7f
2:	and	RING_MASK(%r11), %rdx
	mov	%rax, 4096(%r11,%rdx,8)
3:
	.if \flags
	mov	-40(%rsp), %ax
	add	$0x7f, %al			/* overflows exactly when OF was set */
	sahf
	.endif
	mov	-8(%rsp), %rax
	mov	-16(%rsp), %rdx
	mov	-24(%rsp), %r11
	ret
	.if !\value
5:	SLOW_CALL AG_SLOW_RING
	test	%r11, %r11
	jnz	1b
	jmp	3b
6:	SLOW_CALL AG_SLOW_SYNC
	test	%r11, %r11
	jnz	1b
	jmp	3b
	.endif
	MOVE
	STUB_END \name
.endm

	RECORD ag_record_entry, 0
	RECORD ag_record_exit, 1
	.globl	ag_records_end
	.hidden	ag_records_end
ag_records_end:
	RECORD ag_record_value, 1, 1

/* The slot of the area that called a stub, from the stub's return address
 * (areas of `size` slots, or calling in their first `size` bytes), and its
 * REF word: reg = REF. */
.macro CALLER_REF reg, size
	mov	(%rsp), \reg
	and	$-\size, \reg
	mov	AG_SLOT_REF(\reg), \reg
.endm

/*
 * A callee not instrumented yet (the area's flag byte for it is still 0,
 * emit.c): its ag_callee is the slot's REF word, found from the return
 * address by masking (test_emit checks the call ends in the first
 * AG_SLOT_SMALL bytes of the slot).  ag_slow instruments it; the area goes on to its
 * entry record whatever the answer.  The flags are dead (before a call or
 * a jump to a function).
 */
	STUB	ag_instrument_stub
	mov	%r11, -24(%rsp)
	CALLER_REF %r11, AG_SLOT_SMALL		/* the ag_callee (small or big slot:
						 * the area calls in its first bytes) */
	bts	$56 + 1, %r11			/* AG_SLOW_INSTRUMENT << 56 */
	CALL_SLOW
	mov	-24(%rsp), %r11
	ret
	STUB_END ag_instrument_stub

/*
 * An indirect area's cache missed (emit.c): r11 = the target, S-32 the
 * program's r11.  The site (its ag_indirect_site) is the slot's REF word,
 * found from the return address by masking.  A target the cache knows to
 * be untraced goes untraced at once; else ag_tramp_slow (whose fast path
 * refills the cache from the site's known callees) answers 0 or 2
 * (untraced: the agent runs on this thread, or runtime-managed code) or
 * retry.  Returns r11 = the target, ZF set: traced (the area retries its
 * hit path), ZF clear: untraced.
 */
	STUB	ag_indirect_stub
	mov	%rax, -8(%rsp)
	mov	%rdx, -16(%rsp)
	movq	ag_tls_target@gottpoff(%rip), %rax
	mov	%r11, %fs:(%rax)		/* the target, for ag_slow */
	CALLER_REF %rdx, AG_SLOT_BIG		/* the ag_indirect_site (indirect
						 * areas are big) */
	mov	IS_CACHE(%rdx), %rax
	cmp	24(%rax), %r11			/* its cache's untraced word */
	je	8f
	movabs	$(AG_SLOW_INDIRECT << 56), %r11
	or	%rdx, %r11
	CALL_SLOW
	mov	%r11, %rdx			/* the answer */
	movq	ag_tls_target@gottpoff(%rip), %rax
	mov	%fs:(%rax), %r11		/* the target again */
	test	%rdx, %rdx
	je	8f
	cmp	$2, %rdx
	je	8f
	cmp	%rax, %rax			/* ZF: traced */
	jmp	7f
8:	test	%rsp, %rsp			/* not ZF: untraced */
7:	mov	-8(%rsp), %rax			/* (mov keeps the flags) */
	mov	-16(%rsp), %rdx
	ret
	STUB_END ag_indirect_stub

/*
 * An indirect call's budget (budget.c), at its hit path, the target saved
 * at S-40 and r11 the program's: the id of the cached target (its entry
 * word >> 2) indexes the budget's mode table and the counters.  Returns ZF
 * set: counted (the area makes the call, no record); clear: timed (a timed
 * site, a sample, no table yet).  The cache another thread refills
 * meanwhile can at worst count one call for the previous target.
 */
	STUB	ag_budget_stub
	mov	%rax, -8(%rsp)
	mov	%r11, -24(%rsp)
	CALLER_REF %rax, AG_SLOT_BIG		/* the ag_indirect_site */
	mov	IS_CACHE(%rax), %rax
	mov	8(%rax), %rax			/* its entry word */
	shr	$2, %rax
	cmp	$AG_BUDGET_SITES, %rax
	jae	9f
	mov	ag_budget_modes(%rip), %r11
	test	%r11, %r11
	je	9f
	cmpb	$0, (%r11,%rax)
	je	9f
	movq	ag_tls_tick@gottpoff(%rip), %r11
	subb	$1, %fs:(%r11)
	je	9f				/* the sample */
	movq	ag_tls_counts@gottpoff(%rip), %r11
	mov	%fs:(%r11), %r11
	test	%r11, %r11
	je	9f
	addq	$1, (%r11,%rax,8)
	cmp	%rax, %rax			/* ZF: counted */
	jmp	7f
9:	test	%rsp, %rsp			/* not ZF: timed */
7:	mov	-8(%rsp), %rax			/* (mov keeps the flags) */
	mov	-24(%rsp), %r11
	ret
	STUB_END ag_budget_stub

	.globl	ag_tramp_slow
	.hidden	ag_tramp_slow
	.type	ag_tramp_slow, @function
ag_tramp_slow:
	.cfi_startproc
	endbr64
	/*
	 * First, without the full save: a busy or quiet thread is answered
	 * "skip", as ag_slow would answer it.  Then, an indirect site's cache missed a
	 * callee the site has seen before (a polymorphic call alternates
	 * between a few): find it among the site's known callees and refill
	 * the cache -- words first, target last, as ag_indirect_miss does --
	 * then answer "retry".  Anything else goes to C below.
	 */
	pushfq
	push	%rax
	push	%rcx
	push	%rdx
	movq	ag_tls_busy@gottpoff(%rip), %rax
	cmpl	$0, %fs:(%rax)
	jne	8f
	movq	ag_tls_quiet@gottpoff(%rip), %rax
	cmpb	$0, %fs:(%rax)
	jne	8f
	mov	%r11, %rax
	shr	$56, %rax
	cmp	$AG_SLOW_INDIRECT, %eax
	jne	9f
	movabs	$0x00ffffffffffffff, %rax
	and	%r11, %rax			/* the ag_indirect_site */
	movq	ag_tls_target@gottpoff(%rip), %rcx
	movq	%fs:(%rcx), %rdx		/* the callee this call goes to */
	xor	%ecx, %ecx
1:	cmp	IS_KNOWN_TARGETS(%rax,%rcx,8), %rdx
	je	2f
	inc	%ecx
	cmp	$8, %ecx
	jb	1b
	jmp	9f
2:	mov	IS_KNOWN_IDS(%rax,%rcx,4), %ecx
	test	%ecx, %ecx			/* its id not written yet: to C */
	jz	9f
	mov	IS_CACHE(%rax), %rax		/* the ag_indirect_cache */
	shl	$2, %rcx
	mov	%rcx, 8(%rax)			/* entry word: id << 2 | TRACE_ENTRY */
	or	$1, %rcx
	mov	%rcx, 16(%rax)			/* exit word: id << 2 | TRACE_EXIT */
	mov	%rdx, (%rax)			/* target */
	pop	%rdx
	pop	%rcx
	pop	%rax
	popfq
	mov	$1, %r11d
	ret
8:	pop	%rdx			/* busy or quiet: skip */
	pop	%rcx
	pop	%rax
	popfq
	xor	%r11d, %r11d
	ret
9:	pop	%rdx
	pop	%rcx
	pop	%rax
	popfq
	SAVE_ALL
	mov	%r11, %rdi
	call	ag_slow
	mov	%rax, 8(%rbp)		/* the answer, restored into r11 */
	RESTORE_ALL
	ret
	.cfi_endproc
	.size	ag_tramp_slow, .-ag_tramp_slow

	.globl	ag_tramp_return
	.hidden	ag_tramp_return
	.type	ag_tramp_return, @function
ag_tramp_return:
	.cfi_startproc
	/* Unwinders stop here: the real return address lives in the agent's
	 * thread state, which CFI cannot name. */
	.cfi_undefined rip
	endbr64
	push	$0			/* becomes the real return address */
	SAVE_ALL
	call	ag_root_return
	mov	%rax, 12*8(%rbp)	/* the slot pushed above, past the 12 saved words */
	RESTORE_ALL
	ret
	.cfi_endproc
	.size	ag_tramp_return, .-ag_tramp_return

	.globl	ag_tramp_retpoint
	.hidden	ag_tramp_retpoint
	.type	ag_tramp_retpoint, @function
ag_tramp_retpoint:
	.cfi_startproc
	.cfi_undefined rip
	endbr64
	push	$0			/* becomes the real return address */
	SAVE_ALL
	mov	%r11, %rdi
	call	ag_retpoint
	mov	%rax, 12*8(%rbp)
	RESTORE_ALL
	ret
	.cfi_endproc
	.size	ag_tramp_retpoint, .-ag_tramp_retpoint

	/* The end of the trampolines: a thread stopped between ag_tramp_slow
	 * and here is on its way into or out of the agent (activate.c). */
	.globl	ag_tramp_end
	.hidden	ag_tramp_end
ag_tramp_end:

	.section .note.GNU-stack,"",@progbits
