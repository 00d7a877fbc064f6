#!/usr/bin/env python3
"""check_portable.py AGENT_DIR -- the agent's portable C holds nothing of x86-64.

Every .c and .h under AGENT_DIR but the architecture's folder (x86_64/)
is read with its comments left out; none may hold inline assembly (an asm
label naming an exported symbol, `__asm__("fcntl") AG_EXPORT`, is no
assembly), a signal context's registers (REG_*, gregs, uc_mcontext), an
x86 builtin, intrinsic or CPUID, or an int3/call/jmp opcode byte.  Those
live behind agent/arch.h (x86_64/arch.h, x86_64/cpu.c) and agent.h's
x86_64/ sections.  Prints each offence as FILE:LINE and fails.
"""
import os
import re
import sys

ARCH_DIRS = {'x86_64'}
RULES = [
    (re.compile(r'\b(?:__asm__|__asm|asm)\b(?!\("[A-Za-z_]\w*"\)\s*AG_EXPORT)'),
     'inline assembly (x86_64/arch.h)'),
    (re.compile(r'\bREG_[A-Z0-9]+\b|\bgregs\b|\buc_mcontext\b'),
     "a signal context's registers (ag_uc_* in x86_64/arch.h)"),
    (re.compile(r'\b__builtin_ia32_\w+|\b__(?:get_)?cpuid\w*|#\s*include\s*<(?:cpuid|\w*intrin)\.h>'),
     'an x86 builtin, intrinsic or CPUID (x86_64/arch.h, x86_64/cpu.c)'),
    (re.compile(r'\b0[xX](?:[cC][cC]|[eE][89])\b'),
     'an x86 opcode byte: int3, call, jmp (AG_TRAP_BYTE; x86_64/emit.c, sites.c)'),
]


def strip_comments(text):
    """The text with each comment replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
        elif text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def main():
    if len(sys.argv) != 2:
        sys.exit('usage: check_portable.py AGENT_DIR')
    top = sys.argv[1]
    files, bad = [], []
    for d, subdirs, names in os.walk(top):
        subdirs[:] = sorted(s for s in subdirs if s not in ARCH_DIRS)
        files += [os.path.join(d, f) for f in sorted(names) if f.endswith(('.c', '.h'))]
    for path in files:
        with open(path, encoding='utf-8') as f:
            lines = strip_comments(f.read()).split('\n')
        for no, line in enumerate(lines, 1):
            for rule, what in RULES:
                if rule.search(line):
                    bad.append(f'{path}:{no}: {what}: {line.strip()}')
    if not files:
        sys.exit(f'portable-agent: no .c or .h file under {top}')
    if bad:
        print('portable-agent: x86-64 code in the agent\'s portable files:', file=sys.stderr)
        print('\n'.join('  ' + b for b in bad), file=sys.stderr)
        sys.exit(1)
    print(f'portable-agent: {len(files)} files, none with x86-64 code')


main()
