/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * Function arguments at a uprobe, per architecture: the one table that changes
 * for another ABI. x86-64 (System V): rdi, rsi, rdx, rcx, r8, r9, then the
 * stack; the return value in rax. aarch64 (AAPCS64, Grace Hopper): x0..x7, the
 * return value in x0. The register files are the kernel's user-visible
 * `pt_regs` (x86) and `user_pt_regs` (arm64), stable ABI for BPF programs.
 */
#ifndef TWOFOLD_UARGS_H
#define TWOFOLD_UARGS_H

#if defined(__TARGET_ARCH_x86)
struct uregs {
	unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	unsigned long ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};
#define UARG1(r) ((r)->di)
#define UARG2(r) ((r)->si)
#define UARG3(r) ((r)->dx)
#define UARG4(r) ((r)->cx)
#define UARG5(r) ((r)->r8)
#define URET(r) ((r)->ax)
#elif defined(__TARGET_ARCH_arm64)
struct uregs {
	__u64 regs[31];
	__u64 sp, pc, pstate;
};
#define UARG1(r) ((r)->regs[0])
#define UARG2(r) ((r)->regs[1])
#define UARG3(r) ((r)->regs[2])
#define UARG4(r) ((r)->regs[3])
#define UARG5(r) ((r)->regs[4])
#define URET(r) ((r)->regs[0])
#else
#error "uargs.h: no argument table for this architecture"
#endif

#endif
