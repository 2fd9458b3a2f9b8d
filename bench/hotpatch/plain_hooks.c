/*
 * The cheapest compiled-in hook a user could write instead of iprobe: a plain,
 * non-atomic global counter bumped by the -finstrument-functions hooks.  Linked
 * into bench/hotpatch/loop.c built with -finstrument-functions (this file
 * itself is built without it).
 */
unsigned long plain_hook_calls;

void __cyg_profile_func_enter(void* fn, void* call_site) {
    (void)fn, (void)call_site;
    plain_hook_calls++;
}

void __cyg_profile_func_exit(void* fn, void* call_site) {
    (void)fn, (void)call_site;
    plain_hook_calls++;
}
