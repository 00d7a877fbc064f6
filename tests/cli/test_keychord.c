/*
 * test_keychord.c — the evdev backend's chord tracker (cli/keychord.c),
 * fed made-up input event sequences as a keyboard would send them (each
 * key event followed by its SYN_REPORT, auto-repeats as value 2):
 *
 *   1. the chord: Ctrl-Alt-T pressed, once per press; T's auto-repeat is
 *      no new press; released and pressed again, it is;
 *   2. exactly the chord's modifiers: Ctrl-Alt-Shift-T and Ctrl-T are not
 *      Ctrl-Alt-T, nor Ctrl-Alt-Super-T;
 *   3. left and right apart: right Ctrl still held when left Ctrl is let
 *      go; a modifier released before T is not held; a modifier's
 *      auto-repeat keeps it held;
 *   4. order: T held first, then the modifiers, is no press until T is
 *      pressed again;
 *   5. other event types (EV_MSC, EV_LED) with the chord's numbers are not
 *      keys;
 *   6. SYN_DROPPED: the events up to the next SYN_REPORT are dropped, that
 *      SYN_REPORT asks for a sync (-1); after it the state is the device's
 *      (cli_keychord_sync), whether that says a modifier is down or up;
 *      the same sync at open takes modifiers already held.
 *
 * usage: test_keychord.  Returns 0 when all pass.
 */
#include <stdio.h>
#include <string.h>
#include <linux/input-event-codes.h>

#include "cli.h"
#include "../kagent/sptrace_kagent.h"

static int failures;

#define CHECK(cond, ...)                                                          \
	do {                                                                      \
		if (!(cond)) {                                                    \
			fprintf(stderr, "test_keychord:%d: FAIL: ", __LINE__);    \
			fprintf(stderr, __VA_ARGS__);                             \
			fputc('\n', stderr);                                      \
			failures++;                                               \
		}                                                                 \
	} while (0)

/* A key event and its SYN_REPORT: how many presses of the chord they made
 * (-1 if the tracker asked for a sync). */
static int key(struct cli_keychord *k, unsigned code, int value)
{
	int r = cli_keychord_event(k, EV_KEY, code, value);
	int s = cli_keychord_event(k, EV_SYN, SYN_REPORT, 0);

	return s < 0 ? s : r;
}

/* codes[] pressed in order, then released in reverse, as qemu's sendkey
 * and a typist do: the presses of the chord. */
static int type(struct cli_keychord *k, const unsigned *codes, size_t n)
{
	int hits = 0;

	for (size_t i = 0; i < n; i++)
		hits += key(k, codes[i], 1);
	for (size_t i = n; i-- > 0;)
		hits += key(k, codes[i], 0);
	return hits;
}

#define TYPE(k, ...) type(k, (const unsigned[]){ __VA_ARGS__ }, \
			  sizeof (const unsigned[]){ __VA_ARGS__ } / sizeof(unsigned))

static const unsigned CTRL_ALT = SPK_MOD_CTRL | SPK_MOD_ALT;

/* 1. */
static void test_chord(void)
{
	struct cli_keychord k;

	cli_keychord_init(&k, KEY_T, CTRL_ALT);
	CHECK(TYPE(&k, KEY_LEFTCTRL, KEY_LEFTALT, KEY_T) == 1, "ctrl-alt-t is one press");
	CHECK(TYPE(&k, KEY_T) == 0, "t alone is none");
	CHECK(key(&k, KEY_LEFTCTRL, 1) == 0 && key(&k, KEY_LEFTALT, 1) == 0, "modifiers down");
	CHECK(key(&k, KEY_T, 1) == 1, "t down with ctrl and alt held");
	for (int i = 0; i < 5; i++)
		CHECK(key(&k, KEY_T, 2) == 0, "t's auto-repeat %d is no new press", i);
	CHECK(key(&k, KEY_T, 0) == 0, "t released");
	CHECK(key(&k, KEY_T, 1) == 1, "t pressed again, modifiers still held");
	CHECK(key(&k, KEY_T, 0) == 0 && key(&k, KEY_LEFTALT, 0) == 0 &&
	      key(&k, KEY_LEFTCTRL, 0) == 0, "all released");
	CHECK(TYPE(&k, KEY_RIGHTALT, KEY_RIGHTCTRL, KEY_T) == 1, "the right keys, other order");
}

/* 2. */
static void test_exact(void)
{
	struct cli_keychord k;

	cli_keychord_init(&k, KEY_T, CTRL_ALT);
	CHECK(TYPE(&k, KEY_LEFTCTRL, KEY_LEFTALT, KEY_LEFTSHIFT, KEY_T) == 0,
	      "ctrl-alt-shift-t is not ctrl-alt-t");
	CHECK(TYPE(&k, KEY_LEFTCTRL, KEY_T) == 0, "ctrl-t is not ctrl-alt-t");
	CHECK(TYPE(&k, KEY_LEFTALT, KEY_T) == 0, "alt-t is not ctrl-alt-t");
	CHECK(TYPE(&k, KEY_LEFTCTRL, KEY_LEFTALT, KEY_LEFTMETA, KEY_T) == 0,
	      "ctrl-alt-super-t is not ctrl-alt-t");
	CHECK(TYPE(&k, KEY_LEFTCTRL, KEY_LEFTALT, KEY_Y) == 0, "ctrl-alt-y is not ctrl-alt-t");
	CHECK(TYPE(&k, KEY_LEFTCTRL, KEY_LEFTALT, KEY_T) == 1, "and ctrl-alt-t still is");
	cli_keychord_init(&k, KEY_F12, SPK_MOD_SUPER | SPK_MOD_SHIFT);
	CHECK(TYPE(&k, KEY_RIGHTMETA, KEY_LEFTSHIFT, KEY_F12) == 1, "super-shift-f12");
	CHECK(TYPE(&k, KEY_RIGHTMETA, KEY_F12) == 0, "super-f12 is not super-shift-f12");
}

/* 3. */
static void test_left_right(void)
{
	struct cli_keychord k;

	cli_keychord_init(&k, KEY_T, CTRL_ALT);
	key(&k, KEY_LEFTCTRL, 1);
	key(&k, KEY_RIGHTCTRL, 1);
	key(&k, KEY_LEFTCTRL, 0);
	key(&k, KEY_LEFTALT, 1);
	CHECK(key(&k, KEY_T, 1) == 1, "right ctrl still holds ctrl after left ctrl's release");
	key(&k, KEY_T, 0);
	key(&k, KEY_RIGHTCTRL, 0);
	CHECK(key(&k, KEY_T, 1) == 0, "no ctrl left: alt-t");
	key(&k, KEY_T, 0);
	key(&k, KEY_LEFTALT, 0);

	key(&k, KEY_LEFTCTRL, 1);
	key(&k, KEY_LEFTALT, 1);
	key(&k, KEY_LEFTCTRL, 0);
	CHECK(key(&k, KEY_T, 1) == 0, "ctrl released before t");
	key(&k, KEY_T, 0);
	key(&k, KEY_LEFTCTRL, 1);
	for (int i = 0; i < 3; i++)
		key(&k, KEY_LEFTCTRL, 2);
	CHECK(key(&k, KEY_T, 1) == 1, "ctrl down again (and auto-repeating): ctrl-alt-t");
}

/* 4. */
static void test_order(void)
{
	struct cli_keychord k;

	cli_keychord_init(&k, KEY_T, CTRL_ALT);
	CHECK(key(&k, KEY_T, 1) == 0, "t first");
	key(&k, KEY_LEFTCTRL, 1);
	key(&k, KEY_LEFTALT, 1);
	CHECK(key(&k, KEY_T, 2) == 0, "t held through the modifiers is no press");
	CHECK(key(&k, KEY_T, 0) == 0, "t released");
	CHECK(key(&k, KEY_T, 1) == 1, "t pressed again: the chord");
}

/* 5. */
static void test_other_types(void)
{
	struct cli_keychord k;

	cli_keychord_init(&k, KEY_T, CTRL_ALT);
	key(&k, KEY_LEFTCTRL, 1);
	key(&k, KEY_LEFTALT, 1);
	CHECK(cli_keychord_event(&k, EV_MSC, KEY_T, 1) == 0, "EV_MSC is no key");
	CHECK(cli_keychord_event(&k, EV_LED, KEY_T, 1) == 0, "EV_LED is no key");
	CHECK(cli_keychord_event(&k, EV_MSC, KEY_LEFTCTRL, 0) == 0 && key(&k, KEY_T, 1) == 1,
	      "an EV_MSC with ctrl's number did not release ctrl");
}

/* 6. */
static void test_dropped(void)
{
	unsigned char keys[KEY_MAX / 8 + 1];
	struct cli_keychord k;

	cli_keychord_init(&k, KEY_T, CTRL_ALT);
	key(&k, KEY_LEFTCTRL, 1);
	key(&k, KEY_LEFTALT, 1);
	CHECK(cli_keychord_event(&k, EV_SYN, SYN_DROPPED, 0) == 0, "SYN_DROPPED");
	CHECK(cli_keychord_event(&k, EV_KEY, KEY_T, 1) == 0, "t of a partial frame dropped");
	CHECK(cli_keychord_event(&k, EV_KEY, KEY_LEFTCTRL, 0) == 0, "ctrl's release dropped");
	CHECK(cli_keychord_event(&k, EV_SYN, SYN_REPORT, 0) == -1, "the next SYN_REPORT: sync");
	/* the device says: right ctrl and left alt down */
	memset(keys, 0, sizeof keys);
	keys[KEY_RIGHTCTRL / 8] |= 1 << KEY_RIGHTCTRL % 8;
	keys[KEY_LEFTALT / 8] |= 1 << KEY_LEFTALT % 8;
	cli_keychord_sync(&k, keys, sizeof keys);
	CHECK(key(&k, KEY_T, 1) == 1, "after the sync: right ctrl and alt held, t: the chord");
	key(&k, KEY_T, 0);
	/* lost: the release of both; the device says nothing is down */
	cli_keychord_event(&k, EV_SYN, SYN_DROPPED, 0);
	CHECK(key(&k, KEY_T, 1) == -1, "a frame after SYN_DROPPED asks for a sync");
	memset(keys, 0, sizeof keys);
	cli_keychord_sync(&k, keys, sizeof keys);
	key(&k, KEY_T, 0);
	CHECK(key(&k, KEY_T, 1) == 0, "after the sync: nothing held, t alone");
	key(&k, KEY_T, 0);

	/* at open: modifiers already held */
	cli_keychord_init(&k, KEY_T, CTRL_ALT);
	keys[KEY_LEFTCTRL / 8] |= 1 << KEY_LEFTCTRL % 8;
	keys[KEY_RIGHTALT / 8] |= 1 << KEY_RIGHTALT % 8;
	cli_keychord_sync(&k, keys, sizeof keys);
	CHECK(key(&k, KEY_T, 1) == 1, "modifiers held at open count");
	CHECK(key(&k, KEY_RIGHTALT, 0) == 0 && key(&k, KEY_T, 0) == 0 && key(&k, KEY_T, 1) == 0,
	      "and their release too");
}

int main(void)
{
	test_chord();
	test_exact();
	test_left_right();
	test_order();
	test_other_types();
	test_dropped();
	if (failures)
		fprintf(stderr, "test_keychord: %d failed\n", failures);
	else
		printf("test_keychord: all passed\n");
	return failures != 0;
}
