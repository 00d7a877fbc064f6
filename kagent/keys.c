// SPDX-License-Identifier: GPL-2.0
/*
 * keys.c — `--on key CHORD` without X: the keyboard notifier counts the
 * presses of one chord, and /dev/sptrace's opener waits on the count
 * (poll, read).  The protocol:
 *
 *  1. SPK_IOC_KEY_CHORD (process context) stores the chord -- a key code
 *     and a set of modifiers, packed in one word so that the notifier
 *     reads it with one load, never half old and half new -- zeroes the
 *     count and, the first time, registers the notifier
 *     (register_keyboard_notifier: the VT keyboard's chain, which every
 *     keyboard the input layer knows feeds, PS/2 and USB alike).
 *  2. The notifier runs for each key event in the keyboard's interrupt
 *     path, atomic, with kbd_event_lock held: it must not sleep, and the
 *     events come one at a time, so the modifier state below needs no
 *     lock of its own.  It keeps which modifier keys are down (left and
 *     right apart: releasing one Ctrl while the other is held leaves Ctrl
 *     held) from KBD_KEYCODE's down/up; the console's own shift state
 *     (param->shift) is not used, since keymaps may not map every key.
 *  3. A key-down (not an auto-repeat) of the chord's key while exactly
 *     its modifiers are held bumps the count and wakes the waiters.  The
 *     event goes on to the console unchanged (NOTIFY_OK): we watch the
 *     keyboard, we do not take keys from it.
 *  4. poll is readable while the count is not 0; read takes the count
 *     (an exchange with 0, so a press between the poll and the read is
 *     never lost, only reported by the next read).
 *  5. Close and rmmod unregister the notifier; unregister_keyboard_notifier
 *     waits (RCU) until no call of it runs, so nothing touches the state
 *     after.
 */
#include <linux/atomic.h>
#include <linux/fs.h>
#include <linux/input.h>
#include <linux/keyboard.h>
#include <linux/mutex.h>
#include <linux/notifier.h>
#include <linux/poll.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "kagent.h"

/* The modifier keys, and the SPK_MOD_* bit each holds down. */
static const struct {
	u16 code;
	u16 mod;
} mod_keys[] = { SPK_MOD_KEYS };

static u32 chord;               /* code | mods << 16; 0: none (step 1) */
static u32 held;                /* bit i: mod_keys[i] is down (step 2) */
static atomic64_t presses;
static DECLARE_WAIT_QUEUE_HEAD(waiters);
static bool registered;
static DEFINE_MUTEX(keys_lock);   /* registered, against open/close/rmmod */

static u32 held_mods(void)
{
	u32 mods = 0;

	for (unsigned int i = 0; i < ARRAY_SIZE(mod_keys); i++)
		if (held & (1u << i))
			mods |= mod_keys[i].mod;
	return mods;
}

static int on_key(struct notifier_block *nb, unsigned long what, void *data)
{
	struct keyboard_notifier_param *p = data;
	u32 c;

	if (what != KBD_KEYCODE)
		return NOTIFY_DONE;
	for (unsigned int i = 0; i < ARRAY_SIZE(mod_keys); i++)
		if (p->value == mod_keys[i].code) {
			if (p->down)
				held |= 1u << i;
			else
				held &= ~(1u << i);
			return NOTIFY_OK;
		}
	c = READ_ONCE(chord);
	if (c && p->down == 1 && p->value == (c & 0xffff) && held_mods() == c >> 16) {
		atomic64_inc(&presses);
		wake_up_interruptible(&waiters);         /* step 3 */
	}
	return NOTIFY_OK;
}

static struct notifier_block key_nb = { .notifier_call = on_key };

int spk_keys_set(u32 code, u32 mods)
{
	int rc = 0;

	if (code == 0 || code > KEY_MAX || !mods ||
	    (mods & ~(SPK_MOD_CTRL | SPK_MOD_ALT | SPK_MOD_SHIFT | SPK_MOD_SUPER)))
		return -EINVAL;
	mutex_lock(&keys_lock);
	WRITE_ONCE(chord, code | mods << 16);
	atomic64_set(&presses, 0);
	if (!registered) {
		held = 0;                /* no call runs: not registered yet */
		rc = register_keyboard_notifier(&key_nb);
		registered = rc == 0;
	}
	if (rc)
		WRITE_ONCE(chord, 0);
	mutex_unlock(&keys_lock);
	return rc;
}

void spk_keys_clear(void)
{
	mutex_lock(&keys_lock);
	if (registered)
		unregister_keyboard_notifier(&key_nb);   /* step 5 */
	registered = false;
	WRITE_ONCE(chord, 0);
	atomic64_set(&presses, 0);
	mutex_unlock(&keys_lock);
	wake_up_interruptible(&waiters);     /* a reader blocked in read() sees no chord */
}

__poll_t spk_keys_poll(struct file *f, poll_table *wait)
{
	poll_wait(f, &waiters, wait);
	return atomic64_read(&presses) ? EPOLLIN | EPOLLRDNORM : 0;
}

ssize_t spk_keys_read(struct file *f, char __user *buf, size_t len)
{
	u64 n;
	int rc;

	if (len < sizeof n)
		return -EINVAL;
	for (;;) {
		if (!READ_ONCE(chord))
			return -EINVAL;          /* no chord: nothing will come */
		n = atomic64_xchg(&presses, 0);  /* step 4 */
		if (n)
			break;
		if (f->f_flags & O_NONBLOCK)
			return -EAGAIN;
		rc = wait_event_interruptible(waiters, atomic64_read(&presses) ||
					      !READ_ONCE(chord));
		if (rc)
			return rc;
	}
	if (copy_to_user(buf, &n, sizeof n)) {
		atomic64_add(n, &presses);
		return -EFAULT;
	}
	return sizeof n;
}
