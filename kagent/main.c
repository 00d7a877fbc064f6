// SPDX-License-Identifier: GPL-2.0
/*
 * main.c — sptrace's kernel module: /dev/sptrace (sptrace_kagent.h is its
 * interface), loading and unloading.  One opener at a time; its close
 * undoes everything it did (probes.c, step 5; keys.c, step 5).
 */
#include <linux/atomic.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pid.h>
#include <linux/sched/task.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>

#include "kagent.h"

static atomic_t opened = ATOMIC_INIT(0);

static int spk_open(struct inode *inode, struct file *f)
{
	if (atomic_cmpxchg(&opened, 0, 1) != 0)
		return -EBUSY;
	spk_rings_reset();      /* no probes: no writer */
	return 0;
}

static int spk_release(struct inode *inode, struct file *f)
{
	spk_keys_clear();
	spk_scope_clear();
	spk_sites_clear();      /* its handlers read probes.c's table */
	spk_probes_clear();
	atomic_set(&opened, 0);
	return 0;
}

/* The thread group of `pid` (a pid in the caller's namespace). */
static int tgid_of(s32 pid, pid_t *tgid)
{
	struct task_struct *t;
	struct pid *p = find_get_pid(pid);

	if (!p)
		return -ESRCH;
	t = get_pid_task(p, PIDTYPE_PID);
	put_pid(p);
	if (!t)
		return -ESRCH;
	*tgid = t->tgid;
	put_task_struct(t);
	return 0;
}

static long ioc_probe(void __user *arg)
{
	struct spk_probe_req req;
	u64 *addrs;
	s32 *result;
	long rc;

	if (copy_from_user(&req, arg, sizeof req))
		return -EFAULT;
	if (req.n == 0 || req.n > SPK_MAX_PROBES)
		return -EINVAL;
	addrs = kvmalloc_array(req.n, sizeof *addrs, GFP_KERNEL);
	result = kvmalloc_array(req.n, sizeof *result, GFP_KERNEL);
	rc = -ENOMEM;
	if (!addrs || !result)
		goto out;
	rc = -EFAULT;
	if (copy_from_user(addrs, u64_to_user_ptr(req.addrs), req.n * sizeof *addrs))
		goto out;
	rc = spk_probes_add(addrs, result, req.n);
	if (rc == 0 && copy_to_user(u64_to_user_ptr(req.result), result, req.n * sizeof *result))
		rc = -EFAULT;
out:
	kvfree(addrs);
	kvfree(result);
	return rc;
}

static long ioc_sites(void __user *arg)
{
	struct spk_sites_req req;
	struct spk_site *sites;
	long rc;

	if (copy_from_user(&req, arg, sizeof req))
		return -EFAULT;
	if (req.n == 0 || req.n > SPK_MAX_SITES)
		return -EINVAL;
	sites = kvmalloc_array(req.n, sizeof *sites, GFP_KERNEL);
	if (!sites)
		return -ENOMEM;
	rc = -EFAULT;
	if (copy_from_user(sites, u64_to_user_ptr(req.sites), req.n * sizeof *sites))
		goto out;
	rc = spk_sites_add(sites, req.n);
	if (rc == 0 && copy_to_user(u64_to_user_ptr(req.sites), sites, req.n * sizeof *sites))
		rc = -EFAULT;
out:
	kvfree(sites);
	return rc;
}

static long ioc_targets(void __user *arg)
{
	struct spk_targets_req req;
	u64 t[32];              /* a few at a time: the rest wait for the next call */

	if (copy_from_user(&req, arg, sizeof req))
		return -EFAULT;
	req.n = spk_targets_take(t, min_t(u32, req.cap, ARRAY_SIZE(t)));
	if (req.n && copy_to_user(u64_to_user_ptr(req.addrs), t, req.n * sizeof *t))
		return -EFAULT;
	return copy_to_user(arg, &req, sizeof req) ? -EFAULT : 0;
}

static long spk_ioctl(struct file *f, unsigned int cmd, unsigned long arg)
{
	void __user *u = (void __user *)arg;
	struct spk_key_chord kc;
	struct spk_info info;
	pid_t tgid;
	s32 pid;
	int rc;

	switch (cmd) {
	case SPK_IOC_INFO:
		memset(&info, 0, sizeof info);
		info.version = SPK_VERSION;
		info.nrings = nr_cpu_ids;
		info.ring_bytes = SPK_RING_BYTES;
		info.nprobes = spk_probes_count();
		info.nscope = spk_scope_count();
		info.hits = spk_rings_hits();
		spk_probes_missed(&info.missed_depth, &info.missed_nested);
		info.patched = spk_probes_count();
		spk_core_stats(&info.core_misses, &info.core_reached, &info.core_ids,
			       &info.core_pairs);
		return copy_to_user(u, &info, sizeof info) ? -EFAULT : 0;
	case SPK_IOC_PROBE:
		return ioc_probe(u);
	case SPK_IOC_SITES:
		return ioc_sites(u);
	case SPK_IOC_TARGETS:
		return ioc_targets(u);
	case SPK_IOC_SCOPE_ADD:
	case SPK_IOC_SCOPE_DEL:
		if (copy_from_user(&pid, u, sizeof pid))
			return -EFAULT;
		rc = tgid_of(pid, &tgid);
		if (rc)
			return rc;
		if (cmd == SPK_IOC_SCOPE_DEL) {
			spk_scope_del(tgid);
			return 0;
		}
		return spk_scope_add(tgid);
	case SPK_IOC_KEY_CHORD:
		if (copy_from_user(&kc, u, sizeof kc))
			return -EFAULT;
		return spk_keys_set(kc.code, kc.mods);
	}
	return -ENOTTY;
}

static int spk_mmap(struct file *f, struct vm_area_struct *vma)
{
	unsigned long pages = SPK_RING_BYTES >> PAGE_SHIFT;
	void *ring;

	if (vma->vm_flags & VM_WRITE)
		return -EPERM;
	if (vma->vm_pgoff % pages || vma->vm_end - vma->vm_start != SPK_RING_BYTES)
		return -EINVAL;
	ring = spk_ring_of(vma->vm_pgoff / pages);
	if (!ring)
		return -EINVAL;
	vma->vm_flags &= ~VM_MAYWRITE;
	return remap_vmalloc_range(vma, ring, 0);
}

static ssize_t spk_read(struct file *f, char __user *buf, size_t len, loff_t *off)
{
	return spk_keys_read(f, buf, len);
}

static const struct file_operations spk_fops = {
	.owner = THIS_MODULE,
	.open = spk_open,
	.release = spk_release,
	.unlocked_ioctl = spk_ioctl,
	.mmap = spk_mmap,
	.read = spk_read,
	.poll = spk_keys_poll,
	.llseek = noop_llseek,
};

static struct miscdevice spk_dev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "sptrace",
	.fops = &spk_fops,
	.mode = 0600,
};

static int __init spk_init(void)
{
	int rc = spk_rings_init();

	if (rc)
		return rc;
	rc = spk_shadow_init();
	if (rc)
		goto out_rings;
	rc = spk_scope_init();
	if (rc)
		goto out_shadow;
	rc = misc_register(&spk_dev);
	if (rc == 0)
		return 0;
	spk_scope_exit();
out_shadow:
	spk_shadow_exit();
out_rings:
	spk_rings_exit();
	return rc;
}

static void __exit spk_exit(void)
{
	misc_deregister(&spk_dev);   /* no opener can remain: it holds a module ref */
	spk_keys_clear();
	spk_scope_clear();
	spk_sites_clear();
	spk_probes_clear();
	spk_core_exit();
	spk_scope_exit();
	spk_shadow_exit();
	spk_rings_exit();
}

module_init(spk_init);
module_exit(spk_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("sptrace: per-application kernel call tracing into rings /dev/sptrace maps");
