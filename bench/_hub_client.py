"""Learners of bench/hub_class_bench.py: an HTTP client of the hub and of a learner's server, a Chromium learner,
and the /proc watch of the hub's process tree.

- :class:`HttpLearner` logs in with the learner's Unix password (the hub's login form), takes an API token for
  itself, and drives the endpoints JupyterLab calls: the hub's REST API to start the server, nbgrader's
  assignment_list extension (``/assignments/fetch``, ``/submit``, ``/fetch_feedback``, the Assignments tab's
  buttons), the contents API (open and save the notebook), the sessions API (the notebook's kernel) and the
  kernel's websocket (``/api/kernels/ID/channels``) to run each code cell, as JupyterLab's Run All does.
- :class:`BrowserLearner` does the same in Chromium, as tests/test_hub.py does, in a thread of its own
  (Playwright's objects belong to the thread that made them).
- :class:`Watch` samples, every second, RSS of the hub's whole process tree and of every process of the users
  the benchmark made (PSS every 5 s), their CPU time, and the machine's available memory, by phase.
"""

from __future__ import annotations

import datetime
import json
import os
import queue
import re
import statistics
import threading
import time
import uuid
from pathlib import Path

import requests

from _common import CpuWatch, process_tree, say

COURSE_ID = "distributed-pytorch"
STEPS = ("spawn", "fetch", "run", "submit", "close", "feedback")
TICK_S = 1.0
PAGE = os.sysconf("SC_PAGE_SIZE")


class Learner:
    """One learner's round trip: spawn, fetch, run, submit (timed), then feedback; ``error`` says where it failed."""

    def __init__(self, name: str, password: str, url: str, lesson: str, answers: dict[str, str], home: Path,
                 python: Path, watch: "Watch") -> None:
        self.name, self.password, self.url, self.lesson, self.answers = name, password, url, lesson, answers
        self.home, self.python, self.watch = home, python, watch
        self.base = f"{url}/user/{name}"
        self.times: dict[str, float] = {}
        self.error: str | None = None
        self.cell_errors: list[str] = []
        self.feedback_pages: list[str] = []
        self.open_pss_mb: int | None = None

    def _timed(self, steps: tuple[str, ...]) -> None:
        step = steps[0]
        try:
            for step in steps:
                if self.watch.stopped:
                    raise RuntimeError(f"the benchmark stopped: {self.watch.stopped}")
                started = time.monotonic()
                getattr(self, f"do_{step}")()
                self.times[step] = round(time.monotonic() - started, 2)
                say(f"[{self.watch.clock():6.1f} s] {self.name} {step}: {self.times[step]:.1f} s")
        except Exception as exc:  # noqa: BLE001 - a learner's failure is a figure, the class goes on
            self.error = f"{step}: {type(exc).__name__}: {str(exc)[:1500]}"
            say(f"[{self.watch.clock():6.1f} s] {self.name} FAILED at {self.error}")

    def round_trip(self, delay: float) -> None:
        time.sleep(delay)
        self._timed(("spawn", "fetch", "run", "submit", "close"))

    def fetch_feedback(self) -> None:
        self._timed(("feedback",))

    def measure_open(self) -> None:
        """PSS of this learner's processes (server, kernel, rank factory) with the lesson run and still open."""
        self.open_pss_mb = round(user_pss(self.name) / 2**20)

    def notebook_path(self) -> Path:
        return self.home / self.lesson / f"{self.lesson}.ipynb"

    def check_feedback(self) -> None:
        self.feedback_pages = sorted(str(p) for p in (self.home / self.lesson / "feedback").glob(f"*/{self.lesson}.html"))
        if not self.feedback_pages:
            raise AssertionError(f"no feedback page under {self.home / self.lesson / 'feedback'}")

    def close(self) -> None:
        pass


class HttpLearner(Learner):
    """A learner as an HTTP client of the hub and of their own server (the calls JupyterLab makes)."""

    TIMEOUT = 600

    def _call(self, method: str, path: str, **kwargs) -> requests.Response:
        url = path if path.startswith("http") else f"{self.base}{path}"
        response = self.session.request(method, url, timeout=self.TIMEOUT, **kwargs)
        if response.status_code >= 400:
            raise AssertionError(f"{method} {url}: HTTP {response.status_code}: {response.text[:800]}")
        return response

    def do_spawn(self) -> None:
        """The login form with the Unix password, an API token, then the server started and answering."""
        self.session = requests.Session()
        page = self.session.get(f"{self.url}/hub/login", timeout=self.TIMEOUT)
        found = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
        form = {"username": self.name, "password": self.password, **({"_xsrf": found.group(1)} if found else {})}
        login = self.session.post(f"{self.url}/hub/login", data=form, allow_redirects=False, timeout=self.TIMEOUT)
        if login.status_code != 302:
            raise AssertionError(f"login refused: HTTP {login.status_code}: {login.text[:500]}")
        home = self.session.get(f"{self.url}/hub/home", timeout=self.TIMEOUT)  # the page sets this session's _xsrf
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', home.text) or re.search(r'xsrf_token:\s*"([^"]+)"', home.text)
        token = self._call("POST", f"{self.url}/hub/api/users/{self.name}/tokens",
                           json={"note": "bench-class-hub", "expires_in": 7200},
                           headers={"X-XSRFToken": xsrf.group(1) if xsrf else ""}).json()["token"]
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"token {token}"
        self.token = token
        self._call("POST", f"{self.url}/hub/api/users/{self.name}/server")
        deadline = time.monotonic() + self.TIMEOUT
        while time.monotonic() < deadline:
            user = self._call("GET", f"{self.url}/hub/api/users/{self.name}").json()
            server = (user.get("servers") or {}).get("", {})
            if server.get("ready"):
                self._call("GET", "/api/status")
                return
            if not server.get("pending") and not server.get("ready"):
                raise AssertionError(f"the server stopped while starting: {user}")
            time.sleep(1)
        raise AssertionError(f"the server did not start within {self.TIMEOUT} s")

    def _assignment(self, listing, status: str) -> None:
        if isinstance(listing, dict):  # {"success": ..., "value": the list, or the traceback}
            if not listing.get("success"):
                raise AssertionError(f"nbgrader said: {str(listing.get('value'))[-800:]}")
            listing = listing["value"]
        mine = [a for a in listing if a.get("assignment_id") == self.lesson]
        if not any(a.get("status") == status for a in mine):
            raise AssertionError(f"{self.lesson} is not {status}: {mine}")

    def do_fetch(self) -> None:
        form = {"course_id": COURSE_ID, "assignment_id": self.lesson}
        self._assignment(self._call("POST", "/assignments/fetch", data=form).json(), "fetched")

    def do_run(self) -> None:
        """Answers into the fetched notebook, saved; its kernel started; every code cell run; the outputs saved."""
        path = f"{self.lesson}/{self.lesson}.ipynb"
        nb = self._call("GET", f"/api/contents/{path}", params={"content": 1}).json()["content"]
        for cell in nb["cells"]:
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if gid in self.answers:
                cell["source"] = self.answers[gid]
        self._call("PUT", f"/api/contents/{path}", json={"type": "notebook", "format": "json", "content": nb})
        session = self._call("POST", "/api/sessions", json={"path": path, "name": f"{self.lesson}.ipynb",
                                                            "type": "notebook", "kernel": {"name": "python3"}}).json()
        self.session_id = session["id"]
        kernel = Kernel(self.url.replace("http", "ws", 1) + f"/user/{self.name}", session["kernel"]["id"],
                        self.token, self.name, self.watch)
        try:
            kernel.call("kernel_info_request", {}, timeout=300)
            count = 0
            for index, cell in enumerate(nb["cells"]):
                if cell["cell_type"] != "code":
                    continue
                outputs, error = kernel.execute("".join(cell["source"]) if isinstance(cell["source"], list)
                                                else cell["source"])
                count += 1
                cell["outputs"], cell["execution_count"] = outputs, count
                if error:
                    self.cell_errors.append(f"cell {index}: {error}")
        finally:
            kernel.close()
        self._call("PUT", f"/api/contents/{path}", json={"type": "notebook", "format": "json", "content": nb})
        self.measure_open()

    def do_submit(self) -> None:
        form = {"course_id": COURSE_ID, "assignment_id": self.lesson}
        self._assignment(self._call("POST", "/assignments/submit", data=form).json(), "submitted")

    def do_close(self) -> None:
        """The notebook closed and its kernel shut down (JupyterLab's Close and Shut Down Notebook)."""
        self._call("DELETE", f"/api/sessions/{self.session_id}")

    def do_feedback(self) -> None:
        form = {"course_id": COURSE_ID, "assignment_id": self.lesson}
        self._call("POST", "/assignments/fetch_feedback", data=form)
        self.check_feedback()


class Kernel:
    """A kernel's websocket (``/api/kernels/ID/channels``), JSON messages as JupyterLab's default protocol sends."""

    def __init__(self, base: str, kernel_id: str, token: str, user: str, watch: "Watch") -> None:
        import websocket

        self.session, self.user, self.watch = uuid.uuid4().hex, user, watch
        self.ws = websocket.create_connection(f"{base}/api/kernels/{kernel_id}/channels?session_id={self.session}",
                                              header=[f"Authorization: token {token}"], timeout=300)
        self.ws.settimeout(5)

    def _send(self, msg_type: str, content: dict) -> str:
        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps({
            "header": {"msg_id": msg_id, "username": self.user, "session": self.session, "msg_type": msg_type,
                       "version": "5.3", "date": datetime.datetime.now(datetime.timezone.utc).isoformat()},
            "parent_header": {}, "metadata": {}, "content": content, "channel": "shell", "buffers": []}))
        return msg_id

    def _messages(self, msg_id: str, timeout: float):
        import websocket

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.watch.stopped:
                raise RuntimeError(f"the benchmark stopped: {self.watch.stopped}")
            try:
                frame = self.ws.recv()
            except websocket.WebSocketTimeoutException:
                continue
            if isinstance(frame, bytes):
                continue  # a message with binary buffers: no cell of the lesson sends one
            msg = json.loads(frame)
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                yield msg
        raise TimeoutError(f"no reply from the kernel within {timeout:.0f} s")

    def call(self, msg_type: str, content: dict, timeout: float) -> dict:
        msg_id = self._send(msg_type, content)
        for msg in self._messages(msg_id, timeout):
            if msg["channel"] == "shell":
                return msg
        raise AssertionError("unreachable")

    def execute(self, code: str, timeout: float = 900) -> tuple[list[dict], str | None]:
        """Run ``code``: its outputs as nbformat keeps them, and the error's name and value if it raised."""
        msg_id = self._send("execute_request", {"code": code, "silent": False, "store_history": True,
                                                "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
        outputs, error, replied, idle = [], None, False, False
        for msg in self._messages(msg_id, timeout):
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind == "stream":
                outputs.append({"output_type": "stream", "name": content["name"], "text": content["text"]})
            elif kind in ("display_data", "execute_result"):
                out = {"output_type": kind, "data": content["data"], "metadata": content.get("metadata", {})}
                if kind == "execute_result":
                    out["execution_count"] = content.get("execution_count")
                outputs.append(out)
            elif kind == "error":
                outputs.append({"output_type": "error", **{k: content[k] for k in ("ename", "evalue", "traceback")}})
                error = f"{content['ename']}: {content['evalue'][:300]}"
            elif kind == "execute_reply":
                replied = True
            elif kind == "status" and content.get("execution_state") == "idle":
                idle = True
            if replied and idle:
                return outputs, error
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.ws.close()


class BrowserLearner(Learner):
    """A learner in Chromium (headless, as tests/test_hub.py drives it), in a thread that owns its Playwright."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tasks: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        from playwright.sync_api import sync_playwright
        from conftest import CHROMIUM, CHROMIUM_ARGS

        with sync_playwright() as playwright:
            self.browser = None
            try:
                while True:
                    task, done = self.tasks.get()
                    try:
                        if task is None:
                            break
                        if self.browser is None:
                            self.browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                        task()
                    except Exception as exc:  # noqa: BLE001 - Chromium did not start: this learner's failure
                        self.error = f"chromium: {type(exc).__name__}: {str(exc)[:1500]}"
                    finally:
                        done.set()
            finally:
                if self.browser is not None:
                    self.browser.close()

    def _in_thread(self, task) -> None:
        done = threading.Event()
        self.tasks.put((task, done))
        done.wait()

    def round_trip(self, delay: float) -> None:
        time.sleep(delay)
        self._in_thread(lambda: self._timed(("spawn", "fetch", "run", "submit", "close")))

    def fetch_feedback(self) -> None:
        self._in_thread(lambda: self._timed(("feedback",)))

    def close(self) -> None:
        self.tasks.put((None, threading.Event()))
        self.thread.join(60)

    def do_spawn(self) -> None:
        from test_browser import LabPage

        self.context = self.browser.new_context(viewport={"width": 1400, "height": 900})
        self.context.set_default_timeout(600_000)
        self.page = self.context.new_page()
        self.page.goto(f"{self.url}/hub/login")
        self.page.fill("#username_input", self.name)
        self.page.fill("#password_input", self.password)
        self.page.click("#login_submit")
        self.page.locator("#jp-main-dock-panel").wait_for(timeout=600_000)
        self.lab = LabPage(self.page)

    def _assignments(self):
        self.lab.menu("Nbgrader", "Assignment List")
        panel = self.page.locator("#assignments")
        panel.wait_for()
        panel.locator("#refresh_assignments_list").click()
        return panel

    def do_fetch(self) -> None:
        from playwright.sync_api import expect

        panel = self._assignments()
        panel.locator("#released_assignments_list .list_item", has_text=self.lesson).get_by_role(
            "button", name="Fetch").click()
        fetched = panel.locator("#fetched_assignments_list .list_item", has_text=self.lesson)
        expect(fetched.get_by_role("button", name="Submit")).to_be_visible(timeout=600_000)

    def do_run(self) -> None:
        """Answers written into the fetched file by its owner (as tests/test_hub.py does), then in JupyterLab: open it,
        Run > Run All Cells, save until every code cell has run."""
        from playwright.sync_api import expect
        from test_hub import WRITE_ANSWERS, run_as

        path = self.notebook_path()
        done = run_as(self.name, str(self.python), "-c", WRITE_ANSWERS, str(path), json.dumps(self.answers), "[]")
        assert done.returncode == 0, done.stderr
        self.lab.menu("File", "Open from Path")
        field = self.page.locator(".jp-Dialog input")
        field.fill(f"{self.lesson}/{self.lesson}.ipynb")
        field.press("Enter")
        status = self.page.locator(".jp-StatusBar-TextItem[title^='Change kernel']")
        expect(status).to_have_text(re.compile(r"\| Idle$"), timeout=600_000)
        self.lab.menu("Run", "Run All Cells")
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline:
            if self.watch.stopped:
                raise RuntimeError(f"the benchmark stopped: {self.watch.stopped}")
            time.sleep(5)
            if self.page.locator(".jp-InputArea-prompt", has_text="[*]").count():
                continue
            self.lab.cell(0).click()
            self.page.keyboard.press("Control+s")
            time.sleep(2)
            nb = json.loads(path.read_text())
            code = [c for c in nb["cells"] if c["cell_type"] == "code"]
            errors = [o for c in code for o in c.get("outputs", []) if o["output_type"] == "error"]
            if errors:
                self.cell_errors = [f"{o['ename']}: {o['evalue'][:300]}" for o in errors]
                raise AssertionError(f"a cell raised: {self.cell_errors}")
            if all(c.get("execution_count") for c in code):
                self.measure_open()
                return
        raise TimeoutError("Run All Cells did not finish within 1200 s")

    def do_submit(self) -> None:
        from playwright.sync_api import expect

        panel = self._assignments()
        panel.locator("#fetched_assignments_list .list_item", has_text=self.lesson).get_by_role(
            "button", name="Submit").click()
        expect(panel.locator("#submitted_assignments_list .list_item", has_text=self.lesson)).to_have_count(
            1, timeout=600_000)

    def do_close(self) -> None:
        from playwright.sync_api import expect

        # After Submit the Assignments tab is the current one: bring the notebook's tab forward first.
        path = f"{self.lesson}/{self.lesson}.ipynb"
        self.page.locator(f".lm-DockPanel-tabBar .lm-TabBar-tab[title*='Path: {path}']").click(timeout=120_000)
        self.page.get_by_role("menuitem", name="File", exact=True).click(timeout=120_000)
        self.page.get_by_role("menuitem", name=re.compile("^Close and Shut Down Notebook")).click(timeout=120_000)
        self.page.locator(".jp-Dialog").get_by_role("button", name="Ok").click(timeout=120_000)
        expect(self.page.locator(".jp-NotebookPanel")).to_have_count(0, timeout=120_000)

    def do_feedback(self) -> None:
        from playwright.sync_api import expect

        panel = self._assignments()
        item = panel.locator("#submitted_assignments_list .list_item", has_text=self.lesson).first
        item.get_by_role("button", name="Fetch Feedback").click()
        expect(panel.locator("#submitted_assignments_list", has_text="view feedback")).to_be_visible(timeout=600_000)
        self.check_feedback()


def summary(people: list[Learner]) -> dict:
    """For each step: the slowest learner's seconds (and who), the median, and how many did it."""
    out = {}
    for step in STEPS:
        times = {p.name: p.times[step] for p in people if step in p.times}
        if times:
            slowest = max(times, key=times.get)
            out[step] = {"max": times[slowest], "slowest": slowest, "median": round(statistics.median(times.values()), 2),
                         "n": len(times)}
    return out


def _stat(pid: int) -> tuple[float, float, int] | None:
    """CPU seconds of ``pid`` and of its reaped children, and its RSS in bytes."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick, int(fields[21]) * PAGE


def user_pss(name: str) -> int:
    """PSS in bytes of every process of the Unix user ``name``."""
    import pwd

    uid, total = str(pwd.getpwnam(name).pw_uid), 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            found = re.search(r"^Uid:\s+(\d+)", (entry / "status").read_text(), re.M)
            if found and found.group(1) == uid:
                for line in (entry / "smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


def _available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


class Watch(threading.Thread):
    """Samples the hub's process tree and the made users' processes every second, by phase."""

    def __init__(self, root_pid: int, users, min_free_gb: float) -> None:
        super().__init__(daemon=True)
        self.root, self.users, self.min_free = root_pid, users, min_free_gb * 2**30
        self.started = time.monotonic()
        self.samples: list[dict] = []
        self.marks: list[tuple[str, float]] = [("start", 0.0)]
        self.stopped: str | None = None
        self._end = threading.Event()

    def clock(self) -> float:
        return time.monotonic() - self.started

    def phase(self, name: str) -> None:
        self.marks.append((name, self.clock()))

    def stop(self) -> None:
        self._end.set()
        self.join(10)

    def run(self) -> None:
        step = 0
        while not self._end.is_set():
            self.samples.append(self._sample(pss=step % 5 == 0))
            step += 1
            available = self.samples[-1]["available"]
            if available < self.min_free and not self.stopped:
                self.stopped = (f"the machine's available memory fell to {available / 2**30:.1f} GB "
                                f"(--min-free-gb {self.min_free / 2**30:g})")
                say(f"STOPPING: {self.stopped}; ending every process of the benchmark's users now")
                for pid in self.users.processes():  # every one was started by this benchmark's hub
                    try:
                        os.kill(pid, 9)
                    except ProcessLookupError:
                        pass
            self._end.wait(TICK_S)

    def _sample(self, pss: bool) -> dict:
        tree, theirs = set(process_tree(self.root)), set(self.users.processes())
        pids = tree | theirs
        cpu, rss, groups, total_pss = 0.0, 0, {"hub": 0, "servers": 0, "kernels": 0}, 0
        for pid in pids:
            stat = _stat(pid)
            if stat is None:
                continue
            own, reaped, size = stat
            if pid in tree:
                cpu += own + reaped
            rss += size
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                cmd = b""
            if b"jupyterhub-singleuser" in cmd:
                groups["servers"] += size
            elif pid not in theirs:  # root's: make, JupyterHub, the proxy, the culler
                groups["hub"] += size
            else:
                groups["kernels"] += size
            if pss:
                try:
                    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                        if line.startswith("Pss:"):
                            total_pss += int(line.split()[1]) * 1024
                            break
                except OSError:
                    pass
        return {"t": self.clock(), "cpu": cpu, "rss": rss, **groups, "pss": total_pss if pss else None,
                "available": _available(), "processes": len(pids), "machine": CpuWatch._machine_busy() or 0.0}

    def figures(self) -> dict:
        """Per phase: peak RSS (and its parts), peak PSS, the rise in the machine's used memory, CPU and busy cores."""
        out, mb = {}, lambda b: round(b / 2**20)
        bounds = self.marks + [("end", float("inf"))]
        for (name, start), (_, end) in zip(bounds, bounds[1:]):
            inside = [s for s in self.samples if start <= s["t"] < end]
            if len(inside) < 2:
                continue
            peak = max(inside, key=lambda s: s["rss"])
            wall = inside[-1]["t"] - inside[0]["t"]
            cpu = max(0.0, inside[-1]["cpu"] - inside[0]["cpu"])
            # The busiest 5 s from /proc/stat (others' work included): the tree's own sum can jump for a moment when a
            # process is read just before its parent reaps it and the parent's count of reaped children just after.
            busiest = max(((b["machine"] - a["machine"]) / (b["t"] - a["t"]) for a, b in zip(inside, inside[5:])
                           if b["t"] > a["t"]), default=0.0)
            out[name] = {
                "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "busy_mean": round(cpu / wall, 2) if wall else 0.0,
                "machine_busy_peak_5s": round(busiest, 2), "rss_peak_mb": mb(peak["rss"]), "hub_rss_mb": mb(peak["hub"]),
                "servers_rss_mb": mb(peak["servers"]), "kernels_rss_mb": mb(peak["kernels"]),
                "pss_peak_mb": mb(max((s["pss"] or 0) for s in inside)),
                "used_rise_mb": mb(inside[0]["available"] - min(s["available"] for s in inside)),
                "processes_peak": max(s["processes"] for s in inside),
                "machine_busy_mean": round((inside[-1]["machine"] - inside[0]["machine"]) / wall, 2) if wall else 0.0,
            }
        return out
