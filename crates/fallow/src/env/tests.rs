//! The environment's parsing: every variable, its warnings and the defaults it falls back to.

use super::*;
use crate::config::Tunables;

fn run_over(base: Config, vars: &[(&str, &str)]) -> (EnvSettings, Vec<String>) {
    let mut warnings = Vec::new();
    let s = parse(
        base,
        |name| vars.iter().find(|(k, _)| k.as_bytes() == name.to_bytes()).map(|(_, v)| v.as_bytes()),
        &mut |m| warnings.push(String::from_utf8(m.to_vec()).unwrap()),
    );
    (s, warnings)
}

fn run(vars: &[(&str, &str)]) -> (EnvSettings, Vec<String>) {
    run_over(Config::default(), vars)
}

fn defaults() -> EnvSettings {
    EnvSettings { threshold: DEFAULT_THRESHOLD, stats: false, config: Config::default() }
}

#[test]
fn good_values() {
    let (s, w) = run(&[
        ("FALLOW_THRESHOLD", "1m"),
        ("FALLOW_REPORT", "free"),
        ("FALLOW_REPORT_DELAY_MS", "500"),
        ("FALLOW_ZEROING", "off"),
        ("FALLOW_THP", "1"),
        ("FALLOW_STATS", "1"),
        ("FALLOW_ARENA_SIZE", "2G"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    let tunables =
        Tunables { report_mode: ReportMode::Free, report_delay_ms: 500, zeroing: false, ..Tunables::default() };
    let config = Config { thp: true, arena_size: 2 << 30, tunables, ..Config::default() };
    assert_eq!(s, EnvSettings { threshold: 1 << 20, stats: true, config });
    s.config.validate().unwrap();

    let (s, w) = run(&[("FALLOW_REPORT", "off"), ("FALLOW_ZEROING", "idle"), ("FALLOW_THP", "0")]);
    assert!(w.is_empty(), "{w:?}");
    assert!(!s.config.tunables.report && s.config.tunables.zeroing && !s.config.thp);
    assert_eq!(run(&[("FALLOW_REPORT", "dontneed")]).0.config.tunables.report_mode, ReportMode::DontNeed);
}

#[test]
fn bad_values_warn_once_each_and_keep_defaults() {
    let (s, w) = run(&[
        ("FALLOW_THRESHOLD", "lots"),
        ("FALLOW_REPORT", "sometimes"),
        ("FALLOW_REPORT_DELAY_MS", "5k"),
        ("FALLOW_ZEROING", "busy"),
        ("FALLOW_THP", "yes"),
        ("FALLOW_STATS", "2"),
        ("FALLOW_ARENA_SIZE", "-1"),
    ]);
    assert_eq!(s, defaults());
    assert_eq!(w.len(), 7, "{w:?}");
    assert!(w[0].contains("FALLOW_THRESHOLD=\"lots\"") && w[0].contains("default 262144"), "{}", w[0]);
    assert!(w[1].contains("FALLOW_REPORT") && w[1].contains("default dontneed"));
    assert!(w[2].contains("FALLOW_REPORT_DELAY_MS") && w[2].contains("default 2000"));
    assert!(w[3].contains("FALLOW_ZEROING") && w[3].contains("default idle"));
    assert!(w[4].contains("FALLOW_THP") && w[4].contains("default 0"));
    assert!(w[5].contains("FALLOW_ARENA_SIZE") && w[5].contains("default 0 (the machine's RAM)"), "{}", w[5]);
    assert!(w[6].contains("FALLOW_STATS"));
    let (_, w) = run(&[("FALLOW_THRESHOLD", "99999999999999999999g")]);
    assert_eq!(w.len(), 1);
}

#[test]
fn out_of_range_values_warn_once_each_naming_the_value_used() {
    let gib = 1usize << 30;
    let (s, w) = run(&[
        ("FALLOW_THRESHOLD", "100"),
        ("FALLOW_REPORT_DELAY_MS", "3600001"),
        ("FALLOW_ARENA_SIZE", "100m"),
    ]);
    assert_eq!((s.threshold, s.config.tunables.report_delay_ms, s.config.arena_size), (4096, 3_600_000, gib));
    assert_eq!(w.len(), 3, "{w:?}");
    assert!(w[0].contains("FALLOW_THRESHOLD=\"100\" is below one page") && w[0].ends_with("; using 4096\n"), "{}", w[0]);
    assert!(w[1].contains("FALLOW_REPORT_DELAY_MS=\"3600001\"") && w[1].ends_with("; using 3600000\n"), "{}", w[1]);
    assert!(
        w[2].contains("FALLOW_ARENA_SIZE=\"100m\" is below the largest block") && w[2].ends_with("; using 1073741824\n"),
        "{}",
        w[2]
    );

    let (s, w) = run(&[("FALLOW_THRESHOLD", "2g"), ("FALLOW_ARENA_SIZE", "2T")]);
    // "2T" has no known suffix: not a size, the default applies.
    assert_eq!((s.threshold, s.config.arena_size), (gib, 0));
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w[0].contains("FALLOW_THRESHOLD=\"2g\" is above the largest block") && w[0].ends_with("; using 1073741824\n"),
        "{}",
        w[0]
    );
    assert!(w[1].contains("FALLOW_ARENA_SIZE=\"2T\"") && w[1].contains("using the default 0"), "{}", w[1]);

    let (s, w) = run(&[("FALLOW_ARENA_SIZE", "2000g"), ("FALLOW_THRESHOLD", "1k")]);
    assert_eq!((s.config.arena_size, s.threshold), (1 << 40, 4096));
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("FALLOW_THRESHOLD=\"1k\"") && w[0].ends_with("; using 4096\n"), "{}", w[0]);
    assert!(
        w[1].contains("FALLOW_ARENA_SIZE=\"2000g\" is above 1 TiB") && w[1].ends_with("; using 1099511627776\n"),
        "{}",
        w[1]
    );

    let (s, w) = run(&[("FALLOW_ARENA_SIZE", "1536m")]);
    assert_eq!(s.config.arena_size, 2 * gib);
    assert!(w.len() == 1 && w[0].contains("not a multiple") && w[0].ends_with("; using 2147483648\n"), "{w:?}");

    // The bounds themselves are in range, and 0 means the machine's RAM.
    let (s, w) = run(&[
        ("FALLOW_THRESHOLD", "4096"),
        ("FALLOW_REPORT_DELAY_MS", "3600000"),
        ("FALLOW_ARENA_SIZE", "1024g"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!((s.threshold, s.config.tunables.report_delay_ms, s.config.arena_size), (4096, 3_600_000, 1 << 40));
    let (s, w) = run(&[("FALLOW_THRESHOLD", "1g"), ("FALLOW_ARENA_SIZE", "0"), ("FALLOW_REPORT_DELAY_MS", "0")]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!((s.threshold, s.config.arena_size, s.config.tunables.report_delay_ms), (gib, 0, 0));
}

#[test]
fn small_objects_switch_and_warn_on_a_bad_value() {
    let (s, w) = run(&[("FALLOW_SMALL", "1")]);
    assert!(w.is_empty() && s.config.small_objects, "{w:?}");
    let (s, w) = run_over(Config { small_objects: true, ..Config::default() }, &[("FALLOW_SMALL", "0")]);
    assert!(w.is_empty() && !s.config.small_objects, "{w:?}");
    let (s, w) = run(&[("FALLOW_SMALL", "yes")]);
    assert!(!s.config.small_objects);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("FALLOW_SMALL=\"yes\" is not one of 1, 0; using the default 0"), "{}", w[0]);
}

#[test]
fn cache_settings_apply_and_warn_once_each() {
    let (s, w) = run(&[
        ("FALLOW_CACHE", "off"),
        ("FALLOW_CACHE_MAX_ORDER", "4"),
        ("FALLOW_CACHE_HIGH_PAGES", "256"),
        ("FALLOW_CACHE_BATCH_PAGES", "16"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    let c = &s.config;
    assert_eq!((c.cache, c.cache_max_order, c.cache_high_pages, c.cache_batch_pages), (false, 4, 256, 16));
    s.config.validate().unwrap();

    // Out of range: the nearest bound, named; not a number: the default, named.
    let (s, w) = run(&[
        ("FALLOW_CACHE", "yes"),
        ("FALLOW_CACHE_MAX_ORDER", "12"),
        ("FALLOW_CACHE_HIGH_PAGES", "1"),
        ("FALLOW_CACHE_BATCH_PAGES", "lots"),
    ]);
    let c = &s.config;
    assert_eq!((c.cache, c.cache_max_order, c.cache_high_pages, c.cache_batch_pages), (true, 11, 2, 2));
    assert_eq!(w.len(), 4, "{w:?}");
    assert!(w[0].contains("FALLOW_CACHE=\"yes\" is not one of on, off; using the default on"), "{}", w[0]);
    assert!(w[1].contains("FALLOW_CACHE_MAX_ORDER=\"12\" is above 11; using 11"), "{}", w[1]);
    assert!(w[2].contains("FALLOW_CACHE_HIGH_PAGES=\"1\" is below 2; using 2"), "{}", w[2]);
    // The default batch (64) is above the high mark now in effect: the high mark.
    assert!(w[3].contains("FALLOW_CACHE_BATCH_PAGES=\"lots\"") && w[3].ends_with("the default 2\n"), "{}", w[3]);
    s.config.validate().unwrap();

    let (s, w) = run(&[("FALLOW_CACHE_HIGH_PAGES", "100000"), ("FALLOW_CACHE_BATCH_PAGES", "70000")]);
    assert_eq!((s.config.cache_high_pages, s.config.cache_batch_pages), (65536, 65536));
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].ends_with("is above 65536; using 65536\n") && w[1].ends_with("is above 65536; using 65536\n"), "{w:?}");
    let (s, w) = run(&[("FALLOW_CACHE_BATCH_PAGES", "0")]);
    assert!(s.config.cache_batch_pages == 1 && w.len() == 1 && w[0].contains("is below 1; using 1"), "{w:?}");
    // A batch above a smaller high mark, the default batch capped by it without a warning.
    let (s, w) = run(&[("FALLOW_CACHE_HIGH_PAGES", "32")]);
    assert!(w.is_empty() && s.config.cache_batch_pages == 32, "{w:?}");
    s.config.validate().unwrap();
}

#[test]
fn memory_limit_and_pressure() {
    let gib = 1u64 << 30;
    for (v, want) in [
        ("2GiB", MemoryLimit::Bytes(2 * gib)),
        ("512m", MemoryLimit::Bytes(512 << 20)),
        ("512MB", MemoryLimit::Bytes(512 << 20)),
        ("1t", MemoryLimit::Bytes(1 << 40)),
        ("1048576", MemoryLimit::Bytes(1 << 20)),
        ("auto", MemoryLimit::Auto),
        ("off", MemoryLimit::Off),
    ] {
        let (s, w) = run(&[("FALLOW_MEMORY_LIMIT", v)]);
        assert!(w.is_empty(), "{v}: {w:?}");
        assert_eq!(s.config.tunables.memory_limit, want, "{v}");
        s.config.validate().unwrap();
    }
    let (s, w) = run(&[("FALLOW_PRESSURE", "off"), ("FALLOW_MEMORY_LIMIT", "off")]);
    assert!(w.is_empty() && !s.config.tunables.pressure && s.config.tunables.memory_limit == MemoryLimit::Off);

    // Bad values: one warning each, the default kept.
    for v in ["lots", "2GiBs", "-1", "", "GiB", "1.5g", "99999999999t"] {
        let (s, w) = run(&[("FALLOW_MEMORY_LIMIT", v)]);
        assert_eq!(s, defaults(), "{v}");
        assert!(w.len() == 1 && w[0].contains("FALLOW_MEMORY_LIMIT") && w[0].ends_with("using the default auto\n"), "{v}: {w:?}");
    }
    let (s, w) = run(&[("FALLOW_PRESSURE", "psi")]);
    assert_eq!(s, defaults());
    assert!(w.len() == 1 && w[0].contains("FALLOW_PRESSURE=\"psi\"") && w[0].ends_with("using the default auto\n"), "{w:?}");
    // Below one page: one page.
    let (s, w) = run(&[("FALLOW_MEMORY_LIMIT", "100")]);
    assert_eq!(s.config.tunables.memory_limit, MemoryLimit::Bytes(4096));
    assert!(w.len() == 1 && w[0].ends_with("; using 4096\n"), "{w:?}");
}

#[test]
fn ranges_and_defaults_are_the_given_configuration_s() {
    // 16 MiB blocks: the ranges follow the configuration's largest block.
    let base = Config { max_order: 12, arena_size: 64 << 20, ..Config::default() };
    let (s, w) = run_over(base.clone(), &[("FALLOW_ARENA_SIZE", "20m"), ("FALLOW_THRESHOLD", "32m")]);
    assert_eq!((s.config.arena_size, s.threshold), (32 << 20, 16 << 20));
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("FALLOW_THRESHOLD=\"32m\"") && w[0].ends_with("; using 16777216\n"), "{}", w[0]);
    assert!(w[1].contains("not a multiple of the largest block (16777216") && w[1].ends_with("; using 33554432\n"));
    let (s, w) = run_over(base.clone(), &[("FALLOW_ARENA_SIZE", "big")]);
    assert_eq!(s.config, base);
    assert!(w.len() == 1 && w[0].ends_with("using the default 67108864\n"), "{w:?}");

    // FALLOW_THP=1 over 1 MiB blocks: 2 MiB blocks, which the ranges then use.
    let base = Config { max_order: 8, thp: false, ..Config::default() };
    let (s, w) = run_over(base, &[("FALLOW_THP", "1"), ("FALLOW_ARENA_SIZE", "3m")]);
    assert!(s.config.thp && s.config.max_order == 9 && s.config.arena_size == 4 << 20, "{:?}", s.config);
    assert!(w.len() == 1 && w[0].ends_with("; using 4194304\n"), "{w:?}");
    s.config.validate().unwrap();

    // The memfd backing: dontneed and free would free nothing; the default (punch) stays.
    let base = Config { backing: Backing::Memfd, tunables: Tunables::off(), ..Config::default() };
    let (s, w) = run_over(base.clone(), &[("FALLOW_REPORT", "free"), ("FALLOW_ZEROING", "on")]);
    assert_eq!(s.config, base);
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("FALLOW_REPORT=\"free\" does not free memfd pages; using the default off"), "{}", w[0]);
    assert!(w[1].contains("FALLOW_ZEROING=\"on\"") && w[1].contains("the default off"), "{}", w[1]);
    let (s, w) = run_over(base, &[("FALLOW_REPORT", "dontneed")]);
    assert!(w.len() == 1 && !s.config.tunables.report, "{w:?}");
    s.config.validate().unwrap();
}
