/*
 * vkbd.c — a keyboard plugged in while a test runs (test_kagent_evdev.py):
 * a uinput device named "sptrace test keyboard" with Ctrl, Alt, Shift and
 * T.  It says "plugged" once created; each line on stdin is a chord typed
 * on it, keys joined by '-' (ctrl-alt-t): pressed in order, released in
 * reverse, each event followed by its SYN_REPORT; at the end of stdin it
 * is unplugged (UI_DEV_DESTROY) and the program exits 0.
 *
 * usage: vkbd < CHORDS   (needs /dev/uinput: the uinput module)
 */
#include <fcntl.h>
#include <linux/uinput.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

static const struct {
	const char *name;
	int code;
} keys[] = { { "ctrl", KEY_LEFTCTRL }, { "alt", KEY_LEFTALT }, { "shift", KEY_LEFTSHIFT },
	     { "t", KEY_T } };

static int emit(int fd, int type, int code, int value)
{
	struct input_event ev = { .type = type, .code = code, .value = value };

	return write(fd, &ev, sizeof ev) == sizeof ev ? 0 : -1;
}

static int key(int fd, int code, int value)
{
	return emit(fd, EV_KEY, code, value) || emit(fd, EV_SYN, SYN_REPORT, 0) ? -1 : 0;
}

int main(void)
{
	struct uinput_setup us = { .id = { .bustype = BUS_VIRTUAL, .vendor = 0x5354,
					   .product = 0x1 } };
	char line[128];
	int fd = open("/dev/uinput", O_WRONLY | O_CLOEXEC);

	if (fd < 0) {
		perror("vkbd: /dev/uinput");
		return 1;
	}
	strcpy(us.name, "sptrace test keyboard");
	if (ioctl(fd, UI_SET_EVBIT, EV_KEY) < 0) {
		perror("vkbd: UI_SET_EVBIT");
		return 1;
	}
	for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
		if (ioctl(fd, UI_SET_KEYBIT, keys[i].code) < 0) {
			perror("vkbd: UI_SET_KEYBIT");
			return 1;
		}
	if (ioctl(fd, UI_DEV_SETUP, &us) < 0 || ioctl(fd, UI_DEV_CREATE) < 0) {
		perror("vkbd: UI_DEV_CREATE");
		return 1;
	}
	printf("plugged\n");
	fflush(stdout);
	while (fgets(line, sizeof line, stdin)) {
		int codes[8], n = 0;

		for (char *save = NULL, *k = strtok_r(line, "-\n", &save); k && n < 8;
		     k = strtok_r(NULL, "-\n", &save))
			for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
				if (strcmp(k, keys[i].name) == 0)
					codes[n++] = keys[i].code;
		for (int i = 0; i < n; i++)
			if (key(fd, codes[i], 1))
				return perror("vkbd: write"), 1;
		for (int i = n; i-- > 0;)
			if (key(fd, codes[i], 0))
				return perror("vkbd: write"), 1;
		printf("typed %d keys\n", n);
		fflush(stdout);
	}
	ioctl(fd, UI_DEV_DESTROY);
	close(fd);
	printf("unplugged\n");
	return 0;
}
