#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cloakfs_fuzz::targets::rekey_journal(data));
