/*
 * loader.S — the start routine of the thread the injector creates in the
 * target (inject.c copies the bytes between inj_loader_start and
 * inj_loader_end into an executable page there).  Position independent: it
 * reaches everything through its argument, the data block D:
 *
 *   D+0   dlopen   D+8  dlsym   D+16 dlerror   D+24 close
 *   D+32  pthread_detach         D+40 pthread_self
 *   D+48  the memfd's number (int)
 *   D+56  dlopen's handle        D+64 the entry function's return value
 *   D+72  dlclose
 *   D+80  done flag (u32), set last
 *   D+84  cancel flag (u32): the injector gave up waiting
 *   D+88  started flag (u32): the entry function is about to be called
 *   D+96  the entry argument's address
 *   D+128 path "/proc/self/fd/N"  D+192 entry name
 *   D+4096 dlerror's message, copied (it dies with the thread)
 *
 * It loads the object, closes the memfd, calls the entry function, records
 * the outcome, sets the flag the injector polls, detaches itself and ends.
 * If the injector gave up before the entry function was called (inject.c,
 * cancel_load: STARTED is written, then CANCEL read, with a fence between),
 * the object is closed again instead and the entry never runs: a late load
 * leaves nothing behind.  The return value is then -2.
 */
	.text
	.globl	inj_loader_start
	.globl	inj_loader_end
	.hidden	inj_loader_start
	.hidden	inj_loader_end
inj_loader_start:
	push	%rbx
	mov	%rdi, %rbx
	lea	128(%rbx), %rdi
	mov	$2, %esi			/* RTLD_NOW */
	call	*0(%rbx)			/* dlopen */
	mov	%rax, 56(%rbx)
	mov	48(%rbx), %edi
	call	*24(%rbx)			/* close(memfd) */
	mov	56(%rbx), %rdi
	test	%rdi, %rdi
	jz	1f
	lea	192(%rbx), %rsi
	call	*8(%rbx)			/* dlsym(handle, entry) */
	test	%rax, %rax
	jz	1f
	movl	$1, 88(%rbx)			/* started */
	mfence
	cmpl	$0, 84(%rbx)			/* called off? */
	jne	4f
	mov	96(%rbx), %rdi
	call	*%rax				/* entry(argument) */
	mov	%rax, 64(%rbx)
	jmp	3f
4:	mov	56(%rbx), %rdi
	call	*72(%rbx)			/* dlclose(handle) */
	movq	$-2, 64(%rbx)
	jmp	3f
1:	call	*16(%rbx)			/* dlerror() */
	test	%rax, %rax
	jz	3f
	lea	4096(%rbx), %rdi
	mov	%rax, %rsi
	mov	$1023, %ecx
2:	movb	(%rsi), %dl
	movb	%dl, (%rdi)
	test	%dl, %dl
	jz	3f
	inc	%rsi
	inc	%rdi
	dec	%ecx
	jnz	2b
	movb	$0, (%rdi)
3:	movl	$1, 80(%rbx)			/* done */
	call	*40(%rbx)			/* pthread_self */
	mov	%rax, %rdi
	call	*32(%rbx)			/* pthread_detach */
	pop	%rbx
	xor	%eax, %eax
	ret
inj_loader_end:

	.section .note.GNU-stack,"",@progbits
