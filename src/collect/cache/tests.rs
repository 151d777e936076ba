//! Tests of [`super::cache`].
use super::*;

#[test]
fn a_new_address_space_size_keeps_the_fds_on_condition_an_exec_never() {
    let mut c = ProcCache::new(Duration::from_secs(3600));
    let parts = Arc::new(BasicParts {
        fd_count: Some(900),
        ..BasicParts::default()
    });
    c.begin();
    c.put_basic(
        7,
        stamp(1, 100, 1),
        Read::Full(StatusRead::default(), parts),
    );
    c.end_basic(std::iter::empty());
    c.begin();
    // `vsize` moved: the fds are kept if their number holds (phase 1 checks it).
    assert!(
        matches!(c.lookup(7, &stamp(1, 200, 1)), Hit::PartsIfFds(p) if p.fd_count == Some(900))
    );
    // Only faults moved: the fds are kept.
    let faulted = StatStamp {
        minflt: 5,
        ..stamp(1, 100, 1)
    };
    assert!(matches!(c.lookup(7, &faulted), Hit::Parts(..)));
    // A new name (an exec) or another process under the pid: everything again.
    let exec = StatStamp {
        comm: "python3".into(),
        ..stamp(1, 200, 1)
    };
    assert!(matches!(c.lookup(7, &exec), Hit::Miss));
    assert!(matches!(c.lookup(7, &stamp(2, 100, 1)), Hit::Miss));
}

fn stamp(start: u64, vsize: u64, ppid: i32) -> StatStamp {
    StatStamp {
        ppid,
        start_time: start,
        vsize_bytes: vsize,
        ..StatStamp::default()
    }
}

fn detail(wanted: &HashSet<FileKey>) -> Detail {
    Detail {
        pages: None,
        took: Duration::ZERO,
        rollup_at: Instant::now(),
        wanted: wanted.clone(),
        mappings: Vec::new(),
        rollup: None,
        cmdline: Default::default(),
        cgroup: None,
        denied: false,
        tainted: false,
    }
}

type Tick<'a> = (&'a [(i32, StatStamp)], &'a [(i32, &'a HashSet<FileKey>)]);

/// One snapshot as `gather` drives the cache: which processes phase 1 read in full,
/// and which phase 3 read.
fn tick(c: &mut ProcCache, (stamps, wanted): Tick) -> (Vec<i32>, Vec<i32>) {
    c.begin();
    let mut full = Vec::new();
    for (pid, s) in stamps {
        let read = match c.lookup(*pid, s) {
            Hit::All(..) => Read::Reused,
            Hit::Parts(p, _) => Read::Status(StatusRead::default(), p),
            // As phase 1 does: fds kept only with a known, unchanged count (these
            // parts have none).
            Hit::PartsIfFds(p) if p.fd_count.is_some() => Read::Status(StatusRead::default(), p),
            Hit::PartsIfFds(_) | Hit::Miss => {
                full.push(*pid);
                Read::Full(StatusRead::default(), Arc::default())
            }
        };
        c.put_basic(*pid, s.clone(), read);
    }
    c.end_basic(wanted.iter().map(|(p, w)| (*p, *w)));
    let mut read = Vec::new();
    for (pid, w) in wanted {
        let d = c.detail(*pid, w);
        if d.is_none() {
            read.push(*pid);
        }
        c.put_detail(*pid, d.is_none().then(|| detail(w)));
    }
    (full, read)
}

/// Two mappers of one file and a bystander: one snapshot to fill, then what each
/// change makes read again.
#[test]
fn reuse_until_a_stamp_a_co_mapper_or_a_relative_changes() {
    let f: HashSet<FileKey> = [FileKey::from_dev(1, 2)].into();
    let none = HashSet::new();
    let mut c = ProcCache::new(Duration::from_secs(3600));
    let base = vec![
        (10, stamp(1, 100, 1)),
        (11, stamp(1, 100, 1)),
        (12, stamp(1, 100, 1)),
    ];
    let w = [(10, &f), (11, &f), (12, &none)];
    assert_eq!(
        tick(&mut c, (&base, &w)),
        (vec![10, 11, 12], vec![10, 11, 12])
    );
    assert_eq!(tick(&mut c, (&base, &w)), (vec![], vec![]));
    assert_eq!(c.stats.unchanged, 3);
    // 10 faults: its status and maps are read again (not its fds), and both mappers' smaps.
    let mut faulted = base.clone();
    faulted[0].1.minflt = 5;
    assert_eq!(tick(&mut c, (&faulted, &w)), (vec![], vec![10, 11]));
    assert_eq!(c.stats.status_read, 1);
    // 10 maps more: maps and smaps again.
    let mut grown = faulted.clone();
    grown[0].1.vsize_bytes = 200;
    assert_eq!(tick(&mut c, (&grown, &w)), (vec![10], vec![10, 11]));
    assert_eq!(tick(&mut c, (&grown, &w)), (vec![], vec![]));
    // A child of 12 appears: 12 maps no file of interest, its smaps_rollup is kept (for up
    // to ROLLUP_EVERY: `a_moving_process_rollup_is_read_at_most_every_rollup_every`).
    let mut forked = grown.clone();
    forked.push((13, stamp(5, 100, 12)));
    let w2 = [(10, &f), (11, &f), (12, &none), (13, &none)];
    assert_eq!(tick(&mut c, (&forked, &w2)), (vec![13], vec![13]));
    // 11 exits: 10 (same file) is read again.
    let left: Vec<_> = forked.iter().filter(|(p, _)| *p != 11).cloned().collect();
    let w3 = [(10, &f), (12, &none), (13, &none)];
    assert_eq!(tick(&mut c, (&left, &w3)), (vec![], vec![10]));
    // Pid 13 now names another process.
    let mut reused = left.clone();
    reused[2].1 = stamp(9, 100, 12);
    assert_eq!(tick(&mut c, (&reused, &w3)), (vec![13], vec![13]));
}

/// A process that maps no file of interest and moves at every snapshot (a Python server
/// whose buffers are mapped and unmapped every second): its `smaps_rollup`, a walk of its
/// whole page table, is read again only once ROLLUP_EVERY has passed; a mapper of a file
/// of interest is read again at every move, and a new process under the pid at once.
#[test]
fn a_moving_process_rollup_is_read_at_most_every_rollup_every() {
    let f: HashSet<FileKey> = [FileKey::from_dev(1, 2)].into();
    let none = HashSet::new();
    let mut c = ProcCache::new(Duration::from_secs(3600));
    let w = [(20, &none), (21, &f)];
    let mut s = vec![(20, stamp(1, 100, 1)), (21, stamp(1, 100, 1))];
    assert_eq!(tick(&mut c, (&s, &w)), (vec![20, 21], vec![20, 21]));
    for i in 1..5u64 {
        s[0].1.minflt = i;
        s[1].1.minflt = i;
        assert_eq!(tick(&mut c, (&s, &w)), (vec![], vec![21]), "move {i}");
    }
    c.backdate_details(ROLLUP_EVERY);
    s[0].1.minflt = 9;
    assert_eq!(tick(&mut c, (&s, &w)).1, vec![20]);
    // A rollup that took 3 ms to read (a PyTorch process) is kept 30 s, then read again.
    if let Some(e) = c.entries.get_mut(&20) {
        e.detail.as_mut().unwrap().took = Duration::from_millis(3);
    }
    c.backdate_details(Duration::from_secs(20));
    s[0].1.minflt = 10;
    assert_eq!(tick(&mut c, (&s, &w)).1, Vec::<i32>::new());
    c.backdate_details(Duration::from_secs(11));
    s[0].1.minflt = 11;
    assert_eq!(tick(&mut c, (&s, &w)).1, vec![20]);
    assert_eq!(rollup_every(Duration::from_millis(1)), ROLLUP_EVERY);
    assert_eq!(
        rollup_every(Duration::from_millis(3)),
        Duration::from_secs(30)
    );
    assert_eq!(rollup_every(Duration::from_millis(9)), ROLLUP_MAX);
    // Another process under pid 20: read in full, its rollup at once.
    s[0].1 = stamp(7, 100, 1);
    assert_eq!(tick(&mut c, (&s, &w)), (vec![20], vec![20]));
}

/// `rchar` and the faults are kept while `stat` holds, and forgotten when it moves.
#[test]
fn rchar_is_reused_only_while_stat_holds() {
    let none = HashSet::new();
    let mut c = ProcCache::new(Duration::from_secs(3600));
    let base = vec![(10, stamp(1, 100, 1))];
    let w = [(10, &none)];
    tick(&mut c, (&base, &w));
    assert_eq!(c.rchar(10), None, "a new process has none");
    c.put_rchar(10, Some(4096));
    tick(&mut c, (&base, &w));
    assert_eq!(c.rchar(10), Some(4096));
    assert_eq!(c.faults(10), Some((0, 0)));
    let mut faulted = base.clone();
    faulted[0].1.minflt = 3;
    tick(&mut c, (&faulted, &w));
    assert_eq!(c.rchar(10), None, "it faulted: read again");
    assert_eq!(c.faults(10), Some((3, 0)));
    assert_eq!(c.faults(11), None);
}

/// A refresh for age alone reads the process again, not its co-mappers; a refresh
/// that finds its counters moved reads them too.
#[test]
fn an_age_refresh_does_not_read_the_co_mappers_again() {
    let f: HashSet<FileKey> = [FileKey::from_dev(1, 2)].into();
    let mut c = ProcCache::new(Duration::from_secs(60));
    let base = vec![(10, stamp(1, 100, 1)), (11, stamp(1, 100, 1))];
    let w = [(10, &f), (11, &f)];
    assert_eq!(tick(&mut c, (&base, &w)), (vec![10, 11], vec![10, 11]));
    // 10 expires (its entry aged past the limit), nothing changed: phase 1 only.
    c.entries.get_mut(&10).unwrap().read_at = Instant::now() - Duration::from_secs(600);
    assert_eq!(tick(&mut c, (&base, &w)), (vec![10], vec![]));
    // Its phase 3 expires too (a longer age): read again, alone.
    c.entries.get_mut(&10).unwrap().detail_at = Instant::now() - Duration::from_secs(600);
    assert_eq!(tick(&mut c, (&base, &w)), (vec![], vec![10]));
    // 10 expires and faulted meanwhile: 11 is read again too.
    c.entries.get_mut(&10).unwrap().read_at = Instant::now() - Duration::from_secs(600);
    let mut faulted = base.clone();
    faulted[0].1.minflt = 3;
    assert_eq!(tick(&mut c, (&faulted, &w)), (vec![10], vec![10, 11]));
}

#[test]
fn entries_expire_within_the_maximum_age() {
    let mut c = ProcCache::new(Duration::ZERO);
    let s = [(1, stamp(1, 1, 0))];
    assert_eq!(tick(&mut c, (&s, &[])).0, vec![1]);
    assert_eq!(tick(&mut c, (&s, &[])).0, vec![1]);
    let mut c = ProcCache::new(Duration::from_secs(3600));
    assert_eq!(tick(&mut c, (&s, &[])).0, vec![1]);
    assert_eq!(tick(&mut c, (&s, &[])).0, Vec::<i32>::new());
}

/// The stamp of a real process: `stat` is read the first time; then, while `statm` holds,
/// the kept stamp; `stat` again once its memory moved, when watched, or when aged.
#[test]
fn stat_is_read_only_when_statm_moved_or_the_process_is_watched() {
    use std::io::Write;
    let root = std::path::Path::new("/proc");
    // A child that faults in 16 MiB more at each line it reads.
    let mut child = std::process::Command::new("python3")
        .args(["-c", "import sys\nb=[]\nfor l in sys.stdin:\n x=bytearray(16<<20); x[::4096]=bytes([1])*4096; b.append(x); print(len(b), flush=True)"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut grow = |stdin: &mut std::process::ChildStdin| {
        writeln!(stdin, "x").unwrap();
        let mut l = String::new();
        std::io::BufRead::read_line(&mut out, &mut l).unwrap();
        // Until it waits on its input again: `statm` the same twice 50 ms apart.
        let statm = || std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap();
        let mut last = statm();
        for _ in 0..100 {
            std::thread::sleep(Duration::from_millis(50));
            let now = statm();
            if now == last {
                break;
            }
            last = now;
        }
    };
    let mut stdin = child.stdin.take().unwrap();
    grow(&mut stdin);
    let mut c = ProcCache::new(Duration::from_secs(3600));
    let truth = || {
        let t = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        super::super::statfiles::parse_stat(&t).unwrap()
    };
    c.begin();
    let (first, f) = c.read_stamp(root, pid).unwrap();
    assert!(first.statm.is_some());
    assert_eq!(first.start_time, truth().start_time);
    // `statm`'s size is `stat`'s vsize in pages (its resident may differ by the per-CPU
    // counters' batches: the two files read them differently).
    let page = super::super::system::page_size();
    assert_eq!(first.statm.unwrap()[0] * page, first.vsize_bytes);
    c.statm_files.keep(pid, f.unwrap());
    c.put_basic(
        pid,
        first.clone(),
        Read::Full(StatusRead::default(), Arc::default()),
    );
    c.end_basic(std::iter::empty());
    // Nothing moved: the kept stamp, as `stat` would have said.
    c.begin();
    let (same, f) = c.read_stamp(root, pid).unwrap();
    assert!(f.is_none(), "read through the kept descriptor");
    assert_eq!(same, first);
    assert_eq!(same.rss_pages, truth().rss_pages);
    // Watched: `stat` read (the same values here, freshly read).
    c.watch.insert(pid);
    let (watched, _) = c.read_stamp(root, pid).unwrap();
    assert_eq!(watched.minflt, truth().minflt);
    c.watch.clear();
    // It faulted 16 MiB in: `statm` moved, `stat` read again.
    grow(&mut stdin);
    let (moved, _) = c.read_stamp(root, pid).unwrap();
    let now = truth();
    assert!(moved.minflt > first.minflt && moved.rss_pages >= first.rss_pages + 4096);
    assert_eq!(
        (moved.vsize_bytes, moved.rss_pages),
        (now.vsize_bytes, now.rss_pages)
    );
    // Aged: `stat` read whatever `statm` says.
    c.put_basic(pid, moved.clone(), Read::Reused);
    c.entries.get_mut(&pid).unwrap().read_at = Instant::now() - Duration::from_secs(7200);
    c.entries.get_mut(&pid).unwrap().stat.minflt = 0;
    let (aged, _) = c.read_stamp(root, pid).unwrap();
    assert!(aged.minflt > 0, "read from `stat`, not the entry");
    drop(stdin);
    child.wait().unwrap();
}

/// A mapping of file 1:2, inode 3.
fn mapping_of_f() -> MappingSample {
    MappingSample {
        major: 1,
        minor: 2,
        inode: 3,
        ..MappingSample::default()
    }
}

/// A mapper's PSS of a file moves with every other mapper of it, kept by phase 3 or not:
/// another twofold reading its pages, a process left out of the pids asked. Their changes
/// read its `smaps` again; a read that another twofold could have disturbed, or one made
/// where not every process was read, is not kept at all.
#[test]
fn a_mapper_not_kept_a_tainted_read_or_a_partial_view_read_smaps_again() {
    let key = mapping_of_f().key();
    let f: HashSet<FileKey> = [key].into();
    let with_map = || Detail {
        mappings: vec![mapping_of_f()],
        ..detail(&f)
    };
    let other = Arc::new(BasicParts {
        maps: vec![mapping_of_f()],
        ..BasicParts::default()
    });
    let mut c = ProcCache::new(Duration::from_secs(3600));
    let snapshot = |c: &mut ProcCache, other_stamp: StatStamp| {
        c.begin();
        let read = match c.lookup(10, &stamp(1, 100, 1)) {
            Hit::All(..) => Read::Reused,
            _ => Read::Full(StatusRead::default(), Arc::default()),
        };
        c.put_basic(10, stamp(1, 100, 1), read);
        // 20 maps the file, and is never kept (an observer).
        let read = match c.lookup(20, &other_stamp) {
            Hit::All(..) => Read::Reused,
            _ => Read::Full(StatusRead::default(), Arc::clone(&other)),
        };
        c.put_basic(20, other_stamp, read);
        c.end_basic([(10, &f)].into_iter());
        c.detail(10, &f)
    };
    assert!(snapshot(&mut c, stamp(1, 100, 1)).is_none());
    c.put_detail(10, Some(with_map()));
    assert!(
        snapshot(&mut c, stamp(1, 100, 1)).is_some(),
        "nothing moved"
    );
    // 20 moved (it mapped or unmapped pages of the file): 10 reads smaps again.
    assert!(snapshot(&mut c, stamp(1, 200, 1)).is_none());
    c.put_detail(10, Some(with_map()));
    assert!(snapshot(&mut c, stamp(1, 200, 1)).is_some());
    // 20 exits.
    c.begin();
    c.put_basic(10, stamp(1, 100, 1), Read::Reused);
    c.end_basic([(10, &f)].into_iter());
    assert!(c.detail(10, &f).is_none(), "a mapper of the file exited");
    // 20 is back (a new process): read again; then nothing moves.
    assert!(
        snapshot(&mut c, stamp(2, 200, 1)).is_none(),
        "a mapper appeared"
    );
    c.put_detail(10, Some(with_map()));
    assert!(snapshot(&mut c, stamp(2, 200, 1)).is_some());
    // A read made while another twofold could have mapped pages: not kept.
    c.put_detail(
        10,
        Some(Detail {
            tainted: true,
            ..with_map()
        }),
    );
    assert!(snapshot(&mut c, stamp(2, 200, 1)).is_none(), "tainted");
    c.put_detail(10, Some(with_map()));
    assert!(snapshot(&mut c, stamp(2, 200, 1)).is_some());
    // Where not every process is read, its other mappers are unknown: smaps each time;
    // a process that maps no file of interest keeps its own.
    c.sees_host = false;
    assert!(snapshot(&mut c, stamp(2, 200, 1)).is_none(), "partial view");
    let none = HashSet::new();
    c.put_detail(11, Some(detail(&none)));
    c.begin();
    c.put_basic(
        11,
        stamp(1, 100, 1),
        Read::Full(StatusRead::default(), Arc::default()),
    );
    c.end_basic(std::iter::empty());
    c.put_detail(11, Some(detail(&none)));
    c.begin();
    c.put_basic(11, stamp(1, 100, 1), Read::Reused);
    c.end_basic(std::iter::empty());
    assert!(c.detail(11, &none).is_some());
}
