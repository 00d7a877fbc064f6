/*
 * keychord.c — one keyboard's side of a key chord, fed the keyboard's
 * input events (struct input_event's type, code, value): which modifier
 * keys are down, and whether the chord was just pressed.  No I/O: the
 * evdev backend of `--on key` (hotkey.c) reads the devices and feeds each
 * its own tracker; tests/cli/test_keychord.c feeds made-up sequences.
 *
 * The rules, the same as the kernel module's notifier (kagent/keys.c):
 *  1. A modifier key's EV_KEY value 1 (press) or 2 (auto-repeat) holds it
 *     down, 0 releases it; left and right apart, so that releasing one
 *     Ctrl while the other is down leaves Ctrl held.
 *  2. The chord's key pressed (value 1; an auto-repeat, 2, is not a new
 *     press) while exactly the chord's modifiers are held is one press:
 *     Ctrl-Alt-Shift-T is not Ctrl-Alt-T, nor is Ctrl-T.
 *  3. SYN_DROPPED: the kernel's buffer for this reader overflowed and
 *     events were lost, a release perhaps.  Every event up to and
 *     including the next SYN_REPORT is discarded (they belong to a
 *     partial frame), then the caller must read the keys' state from the
 *     device (EVIOCGKEY) into cli_keychord_sync: the tracker says so by
 *     returning -1.  The same sync at open catches modifiers already held.
 */
#include "cli.h"

#include <linux/input-event-codes.h>

#include "../kagent/sptrace_kagent.h"

/* The modifier keys, and the SPK_MOD_* each holds down. */
static const struct {
	unsigned short code;
	unsigned mod;
} mod_keys[] = { SPK_MOD_KEYS };

void cli_keychord_init(struct cli_keychord *k, unsigned code, unsigned mods)
{
	k->code = code;
	k->mods = mods;
	k->held = 0;
	k->dropped = 0;
}

static unsigned held_mods(const struct cli_keychord *k)
{
	unsigned mods = 0;

	for (unsigned i = 0; i < sizeof mod_keys / sizeof *mod_keys; i++)
		if (k->held & (1u << i))
			mods |= mod_keys[i].mod;
	return mods;
}

int cli_keychord_event(struct cli_keychord *k, unsigned type, unsigned code, int value)
{
	if (type == EV_SYN && code == SYN_DROPPED) {
		k->dropped = 1;                              /* rule 3 */
		return 0;
	}
	if (k->dropped) {
		if (type == EV_SYN && code == SYN_REPORT) {
			k->dropped = 0;
			return -1;
		}
		return 0;
	}
	if (type != EV_KEY)
		return 0;
	for (unsigned i = 0; i < sizeof mod_keys / sizeof *mod_keys; i++)
		if (code == mod_keys[i].code) {              /* rule 1 */
			if (value)
				k->held |= 1u << i;
			else
				k->held &= ~(1u << i);
			return 0;
		}
	return code == k->code && value == 1 && held_mods(k) == k->mods;   /* rule 2 */
}

static int has_key(const unsigned char *keys, size_t len, unsigned c)
{
	return c / 8 < len && (keys[c / 8] >> (c % 8) & 1);
}

int cli_keychord_fits(const struct cli_keychord *k, const unsigned char *keys, size_t len)
{
	unsigned mods = 0;

	for (unsigned i = 0; i < sizeof mod_keys / sizeof *mod_keys; i++)
		if (has_key(keys, len, mod_keys[i].code))
			mods |= mod_keys[i].mod;
	return has_key(keys, len, k->code) && (mods & k->mods) == k->mods;
}

void cli_keychord_sync(struct cli_keychord *k, const unsigned char *keys, size_t len)
{
	k->held = 0;
	for (unsigned i = 0; i < sizeof mod_keys / sizeof *mod_keys; i++)
		if (has_key(keys, len, mod_keys[i].code))
			k->held |= 1u << i;
}
