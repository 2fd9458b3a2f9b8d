/*
 * No-op -finstrument-functions hooks linked into static executables by
 * iprobe-cc.  glibc's libc.a defines __cyg_profile_func_exit as an alias of
 * __cyg_profile_func_enter, so in a static link both calls go to one address
 * and coldpatch could not tell entry from exit.  Defining them here, as two
 * functions, keeps libc.a's member out of the link.
 */
void __cyg_profile_func_enter(void *this_fn, void *call_site)
    __attribute__((no_instrument_function, used, noinline));
void __cyg_profile_func_exit(void *this_fn, void *call_site)
    __attribute__((no_instrument_function, used, noinline));

static volatile int iprobe_hook_kind;

void __cyg_profile_func_enter(void *this_fn, void *call_site) {
    (void)this_fn;
    (void)call_site;
    (void)iprobe_hook_kind;
}

void __cyg_profile_func_exit(void *this_fn, void *call_site) {
    (void)this_fn;
    (void)call_site;
    iprobe_hook_kind = 0;
}
