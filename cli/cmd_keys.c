/*
 * cmd_keys.c — `sptrace keys`: the cluster's CA and the hosts' certificates
 * that spdaemons authenticate each other with (spdaemon/keys.c).
 *
 *   sptrace keys init KEYDIR          KEYDIR/ca.crt, KEYDIR/ca.key
 *   sptrace keys issue KEYDIR NAME    KEYDIR/NAME.crt, KEYDIR/NAME.key
 */
#include "cli.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "spd.h"

static const char keys_help[] =
	"usage: sptrace keys init KEYDIR [--days N]\n"
	"       sptrace keys issue KEYDIR NAME [--days N]\n"
	"\n"
	"The keys spdaemons use to trust each other (mutual TLS 1.3).\n"
	"\n"
	"  init    make the cluster's CA: KEYDIR/ca.crt and KEYDIR/ca.key (EC P-256,\n"
	"          valid 3650 days).  Keep ca.key on this machine only: whoever\n"
	"          holds it can add hosts to the cluster.\n"
	"  issue   make the certificate and key of one host, signed by the CA:\n"
	"          KEYDIR/NAME.crt and KEYDIR/NAME.key (valid 825 days).  NAME is the\n"
	"          host's name or IP address, as the other daemons reach it.  Copy\n"
	"          ca.crt, NAME.crt and NAME.key to that host and run\n"
	"          'spdaemon --keys DIR --name NAME' there.\n"
	"\n"
	"KEYDIR is made (mode 0700) if missing and must be yours and writable by no\n"
	"one else; private keys are 0600.  Existing keys are never replaced.\n"
	"\n"
	"options:\n"
	"  --days N     validity in days\n"
	"  -h, --help   this text\n";

int cmd_keys(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "days", required_argument, 0, 'd' }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	const char *verb;
	char *end;
	sp_err err;
	long days = -1;
	int c, init;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (c) {
		case 'd':
			days = strtol(optarg, &end, 10);
			if (*end || end == optarg || days < 1 || days > 36500)
				return cli_error("keys: --days '%s': give a number of days, 1 to "
						 "36500", optarg), 2;
			break;
		case 'h': fputs(keys_help, stdout); return 0;
		case ':':
			return cli_error("keys: option '%s' needs a value; see 'sptrace keys --help'",
					 argv[optind - 1]), 2;
		default:
			return cli_error("keys: unknown option '%s'; see 'sptrace keys --help'",
					 argv[optind - 1]), 2;
		}
	}
	verb = optind < argc ? argv[optind] : "";
	init = strcmp(verb, "init") == 0;
	if (!init && strcmp(verb, "issue") != 0)
		return cli_error("keys: %s; see 'sptrace keys --help'",
				 *verb ? "unknown action (use 'init' or 'issue')" : "say 'init' or "
				 "'issue'"), 2;
	if (argc - optind != (init ? 2 : 3) || !*argv[optind + 1])
		return cli_error("keys: %s", init ? "usage: sptrace keys init KEYDIR"
				 : "usage: sptrace keys issue KEYDIR NAME"), 2;
	const char *dir = argv[optind + 1];

	if (init) {
		if (spd_keys_init(dir, days > 0 ? (int)days : SPD_CA_DAYS, &err))
			return cli_error("keys init: %s", err.msg);
		printf("sptrace: the cluster CA is %s/ca.crt; its key %s/ca.key stays here, "
		       "private\n", dir, dir);
		return 0;
	}
	const char *name = argv[optind + 2];

	if (spd_keys_issue(dir, name, days > 0 ? (int)days : SPD_HOST_DAYS, &err))
		return cli_error("keys issue: %s", err.msg);
	printf("sptrace: %s/%s.crt and %s/%s.key, signed by %s/ca.crt; copy the three files "
	       "to %s and run 'spdaemon --keys DIR --name %s' there\n", dir, name, dir, name, dir,
	       name, name);
	return 0;
}
