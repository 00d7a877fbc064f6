/*
 * tramp.S — the two ways generated code enters the agent's C code.
 *
 * ag_tramp_slow: called from a patch area with r11 = the request.  Saves the
 * flags, every general register and the complete XSAVE state (x87, SSE, AVX
 * upper halves, AVX-512, ...), calls ag_slow(request) on a 64-byte aligned
 * stack, restores everything but r11, which carries ag_slow's answer (r11 is
 * dead at a call site), and returns into the area.  The program can never
 * tell a slow path ran.
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

/* agent.h: AG_SLOW_INDIRECT and the layout of ag_indirect_site (checked
 * by static assertions in instrument.c). */
#define AG_SLOW_INDIRECT 4
#define IS_CACHE 16
#define IS_KNOWN_IDS 24
#define IS_KNOWN_TARGETS 56

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

	.globl	ag_tramp_slow
	.hidden	ag_tramp_slow
	.type	ag_tramp_slow, @function
ag_tramp_slow:
	.cfi_startproc
	endbr64
	/*
	 * First, without the full save: an indirect site's cache missed a
	 * callee the site has seen before (a polymorphic call alternates
	 * between a few): find it among the site's known callees and refill
	 * the cache -- words first, target last, as ag_indirect_miss does --
	 * then answer "retry".  Anything else goes to C below.
	 */
	pushfq
	push	%rax
	push	%rcx
	push	%rdx
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
