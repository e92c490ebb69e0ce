"""Progress bars drawn as diffusers draws its own while it loads, off with
its switches, and mlo.torch's logger."""
import logging
import threading

_log = logging.getLogger("mlo.torch")


def _format_size(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return "%.1f %s" % (n / (1 << shift), unit)
    return "%d B" % n


class _NoBar:
    """A progress bar switched off."""
    total = n = 0

    def update(self, n=1):
        pass

    def refresh(self):
        pass

    def close(self):
        pass


def _bar_config(pipe):
    """How to draw a progress bar as diffusers draws its own while it loads
    (tqdm), None where it is off: diffusers'
    diffusers.utils.logging.disable_progress_bar(), or the pipeline's
    pipe.set_progress_bar_config(disable=True), whose other settings it
    takes too.  Without diffusers, none."""
    try:
        from diffusers.utils import logging as dlogging
        import tqdm.auto  # noqa: F401
    except ImportError:
        return None
    config = dict(getattr(pipe, "_progress_bar_config", None) or {})
    if config.get("disable") or not dlogging.is_progress_bar_enabled():
        return None
    return config


def _progress_bar(pipe, desc, total=None, config=False):
    """A progress bar in bytes (_bar_config: pipe's settings, or config's)."""
    if config is False:
        config = _bar_config(pipe)
    if config is None:
        return _NoBar()
    from tqdm.auto import tqdm
    config = dict(config)
    for k, v in (("desc", desc), ("unit", "B"), ("unit_scale", True), ("unit_divisor", 1024)):
        config.setdefault(k, v)
    return tqdm(total=total, **config)


class _LazyBar:
    """_progress_bar drawn from its first update on: none where nothing
    happens."""

    def __init__(self, pipe, desc):
        self.pipe, self.desc, self.bar = pipe, desc, None

    def update(self, n=1):
        if self.bar is None:
            self.bar = _progress_bar(self.pipe, self.desc)
        self.bar.update(n)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _materialize_progress(pipeline, config, desc):
    """libmlo's materialization progress (each component's file bytes read
    into its slab) on a progress bar drawn from the first bytes read on,
    its total growing by each component's as it starts.  Returns what
    closes it."""
    done, bar = {}, []
    lock = threading.Lock()

    def on(comp, now, total):
        with lock:
            key = comp.name if comp is not None else None
            if not bar:
                bar.append(_progress_bar(None, desc, total, config))
                done[key] = 0
            elif key not in done:
                done[key] = 0
                bar[0].total = (bar[0].total or 0) + total
                bar[0].refresh()
            bar[0].update(now - done[key])
            done[key] = now

    def close():
        pipeline.set_progress(None)
        with lock:
            if bar:
                bar[0].close()

    pipeline.set_progress(on)
    return close


class _DiskLoadBar:
    """A load from disk during a generation (the disk tier reads a
    component's files at each load): while this thread waits in the
    acquire, another polls libmlo's count of the bytes read
    (mlo_component_disk_progress) onto a bar drawn once the load is seen
    in flight; the reader itself calls nothing back.  Used as a context
    around the acquire; nothing is started where no load from disk is in
    flight or coming, or where bars are off."""
    POLL_S = 0.05

    def __init__(self, comp, config, desc):
        self.comp, self.config, self.desc = comp, config, desc
        self.stop = threading.Event()
        self.thread = None

    def __enter__(self):
        if self.config is None:
            return self
        self.thread = threading.Thread(target=self._poll, name="mlo-disk-progress", daemon=True)
        self.thread.start()
        return self

    def _poll(self):
        bar, shown = None, 0
        while True:
            stopping = self.stop.wait(self.POLL_S)
            try:
                done, total = self.comp.disk_progress()
            except Exception:  # the pipeline went away: nothing more to show
                break
            if total and bar is None:
                bar = _progress_bar(None, self.desc, total, self.config)
            if bar is not None:
                if not total:  # its reads are done
                    done = bar.total or 0
                bar.update(done - shown)
                shown = done
            if stopping or (bar is not None and not total):
                break
        if bar is not None:
            bar.close()

    def __exit__(self, *exc):
        if self.thread is not None:
            self.stop.set()
            self.thread.join()
        return False
