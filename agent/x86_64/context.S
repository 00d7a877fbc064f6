/*
 * context.S — the agent's interposers that jump to the C library's function
 * rather than call it: getcontext, setcontext and swapcontext; syscall; dlopen,
 * dlmopen and backtrace.
 *
 * A thread that switches stacks through these leaves calls open on the stack
 * it leaves and resumes calls opened earlier on the stack it enters.  The
 * agent records no stack pointers, so it tells the reader which stack is
 * which: each stub calls ag_context_note (threads.c), which writes context
 * events into the thread's ring and returns the C library's function, then
 * jumps there with the caller's frame and arguments untouched.  A C wrapper
 * could not do this: getcontext returns twice, and its second return would
 * land in a wrapper frame that is long gone.
 *
 * ag_context_note(which, first argument, second argument); which is
 * AG_CTX_GET, AG_CTX_SET or AG_CTX_SWAP (agent.h).
 */
	.text

/* The stub: three argument registers kept around fn(which, first argument,
 * second argument) -- three pushes keep the C call 16-byte aligned -- then
 * a jump to the function fn returns, the caller's frame untouched. */
.macro JUMP_STUB name, which, fn
	.globl	\name
	.type	\name, @function
\name:
	.cfi_startproc
	endbr64
	push	%rdi
	.cfi_adjust_cfa_offset 8
	push	%rsi
	.cfi_adjust_cfa_offset 8
	push	%rdx
	.cfi_adjust_cfa_offset 8
	mov	%rsi, %rdx
	mov	%rdi, %rsi
	mov	$\which, %edi
	call	\fn
	pop	%rdx
	.cfi_adjust_cfa_offset -8
	pop	%rsi
	.cfi_adjust_cfa_offset -8
	pop	%rdi
	.cfi_adjust_cfa_offset -8
	jmp	*%rax
	.cfi_endproc
	.size	\name, .-\name
.endm

	JUMP_STUB getcontext, 0, ag_context_note
	JUMP_STUB setcontext, 1, ag_context_note
	JUMP_STUB swapcontext, 2, ag_context_note

/*
 * syscall(): the C library's, but for SYS_capset (126) and SYS_prctl (157),
 * which go to ag_syscall_creds (creds.c: the control thread mirrors what
 * they change).  Jumped to, not called: the caller's frame and arguments
 * reach the function as they would the C library's (the seventh on the
 * stack, at 8(%rsp)), and a clone returning on another stack returns from
 * the C library's own.  Until the agent's constructor found the C
 * library's, ag_syscall_raw makes the call.
 */
	.globl	syscall
	.type	syscall, @function
syscall:
	.cfi_startproc
	endbr64
	cmp	$126, %rdi
	je	ag_syscall_creds
	cmp	$157, %rdi
	je	ag_syscall_creds
	mov	ag_real_syscall(%rip), %r11
	test	%r11, %r11
	jz	ag_syscall_raw
	jmp	*%r11
	.cfi_endproc
	.size	syscall, .-syscall

/*
 * dlopen, dlmopen and backtrace: ag_unwind_before (unwind.c, step 3) gives
 * libgcc_s the areas' unwind information, then the stub jumps to the C
 * library's function with the caller's frame untouched: dlopen takes the
 * calling object (its RUNPATH, $ORIGIN, its namespace) from its return
 * address, and backtrace's first frame is its caller's.  (dlmopen's third
 * argument is the third register JUMP_STUB keeps.)
 */

	JUMP_STUB dlopen, 0, ag_unwind_before      /* AG_UNWIND_DLOPEN (agent.h) */
	JUMP_STUB dlmopen, 1, ag_unwind_before     /* AG_UNWIND_DLMOPEN */
	JUMP_STUB backtrace, 2, ag_unwind_before   /* AG_UNWIND_BACKTRACE */

	.section .note.GNU-stack,"",@progbits
