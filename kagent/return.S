/* SPDX-License-Identifier: GPL-2.0 */
/*
 * return.S — where a traced thread's hooked kernel function returns to
 * (shadow.c has the protocol, step 3).  Modelled on the kernel's own
 * return_to_handler (arch/x86/kernel/ftrace_64.S): the function's return
 * values (rax, rdx) are kept, spk_shadow_return() pops the thread's shadow
 * frame, writes the exit record and gives the real return address, which
 * is reached by a return (not an indirect jump: a return address carries
 * no ENDBR for IBT, and a return keeps the return-stack buffer balanced).
 * Every other register the function's caller may rely on is callee-saved,
 * so the C call preserves it.
 */
#include <linux/linkage.h>
#include <linux/objtool.h>
#include <asm/percpu.h>
#include <asm/unwind_hints.h>

	.text
SYM_CODE_START(spk_return_trampoline)
	UNWIND_HINT_EMPTY
	ANNOTATE_NOENDBR
	subq	$24, %rsp
	movq	%rax, (%rsp)
	movq	%rdx, 8(%rsp)
	leaq	24(%rsp), %rdi          /* the stack pointer the function returned with */
	call	spk_shadow_return
	movq	%rax, 16(%rsp)          /* the real return address */
	movq	8(%rsp), %rdx
	movq	(%rsp), %rax
	addq	$16, %rsp
	UNWIND_HINT_FUNC
	RET
SYM_CODE_END(spk_return_trampoline)

/*
 * spk_direct — where every hooked function's __fentry__ call lands (an
 * ftrace direct call: probes.c, step 3).  At entry (%rsp) is the way back
 * into the function's body and 8(%rsp) the function's return address.
 * Every thread pays this: the current thread's tgid tested in the scope's
 * bitmap (scope.c), with r10 and r11 only -- scratch registers no C
 * function takes arguments in -- then back.  A traced thread's call goes
 * on to spk_on_direct(body, &return address), with the argument registers
 * kept around it (the function has not run yet: they are its arguments).
 */
SYM_FUNC_START(spk_direct)
	ANNOTATE_NOENDBR
	movq	PER_CPU_VAR(current_task), %r11
	movq	spk_tgid_off(%rip), %r10
	movl	(%r11,%r10), %r11d
	btl	%r11d, spk_scope_bits(%rip)
	jc	.Lin_scope
	RET
.Lin_scope:
	pushq	%rax
	pushq	%rdi
	pushq	%rsi
	pushq	%rdx
	pushq	%rcx
	pushq	%r8
	pushq	%r9
	movq	56(%rsp), %rdi          /* the function's body */
	leaq	64(%rsp), %rsi          /* where its return address is */
	call	spk_on_direct
	popq	%r9
	popq	%r8
	popq	%rcx
	popq	%rdx
	popq	%rsi
	popq	%rdi
	popq	%rax
	RET
SYM_FUNC_END(spk_direct)
