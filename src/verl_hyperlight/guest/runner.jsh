// verl-hyperlight's guest runner for the java image: what `guest/runner.py` is for Python.
//
// hluk's java image runs code as JShell snippets in one long-lived JVM (hyperlight-unikraft's
// drivers/java: `Snippets.run`), so a case cannot be a `java -ea Main` of its own: this runner
// gives the program what that command gives it, as Sandbox Fusion runs it
// (sandbox/runners/major.py): the class Main, compiled on the host (case/compiled.py) and
// mounted as the case's program (a jar), loaded by a class loader of its own with assertions
// on (`-ea`), the request's files in its working directory (on the class path, as `-cp .`
// puts it), stdin from the case's input, stdout and stderr of its own, the launcher's
// messages and statuses, System.exit's status; then it reports the case on the console in
// the frames of `guest/protocol.py`.
//
// The host loads it as the warm-exec, after VerlHyperlightProtocol, a class of protocol.py's
// constants it writes (guests.py), and calls it with a statement: hluk's driver runs the
// `main` of a call made of declarations alone, so nothing here is named main. Java 25 (the
// image's), nothing but the JDK's own modules (the image's are jlinked: java.logging is among
// them).
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.FileDescriptor;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.PrintStream;
import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Set;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;

final class VerlHyperlightRunner {
    private VerlHyperlightRunner() {}

    static final String WORK_DIR = "/tmp/solution";
    // JDK 21's launcher, as `java -ea Main` words what it cannot run.
    static final String NOT_FOUND = "Error: Could not find or load main class Main";
    static final String NO_MAIN = "Error: Main method not found in class Main, please define the main method as:\n"
            + "   public static void main(String[] args)\n"
            + "or a JavaFX application class must extend javafx.application.Application";
    static final String NOT_STATIC = "Error: Main method is not static in class Main, please define the main method as:\n"
            + "   public static void main(String[] args)";

    // The console, taken before any solution runs: the report uses nothing a solution reaches
    // (it may replace System.out, never this stream's descriptor).
    private static final FileOutputStream CONSOLE = new FileOutputStream(FileDescriptor.out);
    // JDK 21 and later log System.exit's status to this logger, on the exiting thread, before
    // the shutdown hooks run (JDK-8301627): the report's hook takes the status from it. Held
    // here: the logging framework keeps loggers weakly, and a collected one loses its handler.
    private static final Logger EXITS = Logger.getLogger("java.lang.Runtime");
    private static volatile Case current;
    // The C library's chdir: Java cannot change its working directory, and a program opens
    // the request's files by paths relative to it (`new File("input.txt")`), as `java Main`
    // run in the service's directory does. Looked up once, before the snapshot (the JDK says
    // once, on the console, that a restricted method was called).
    private static final MethodHandle CHDIR = chdirHandle();

    static MethodHandle chdirHandle() {
        try {
            var linker = Linker.nativeLinker();
            var chdir = linker.defaultLookup().find("chdir").orElseThrow();
            return linker.downcallHandle(chdir, FunctionDescriptor.of(ValueLayout.JAVA_INT, ValueLayout.ADDRESS));
        } catch (Throwable e) {
            return null; // relative paths stay the JVM's start directory's
        }
    }

    static void chdir(String directory) {
        if (CHDIR == null) return;
        try (var arena = Arena.ofConfined()) {
            int done = (int) CHDIR.invokeExact(arena.allocateFrom(directory));
        } catch (Throwable e) {
            // relative paths stay the JVM's start directory's
        }
    }

    static {
        EXITS.setUseParentHandlers(false);
        EXITS.setLevel(Level.FINE);
        EXITS.addHandler(new Handler() {
            @Override
            public void publish(LogRecord record) {
                Case kase = current;
                String message = record.getMessage();
                if (kase == null || message == null) return;
                int colon = message.lastIndexOf(':');
                try {
                    kase.exitStatus = Integer.parseInt(message.substring(colon + 1).trim());
                } catch (NumberFormatException e) {
                    // another message: not an exit
                }
            }

            @Override
            public void flush() {}

            @Override
            public void close() {}
        });
    }

    /** The report's frames, written to the console in as few writes as fit one hluk host
     *  call each (CONSOLE_WRITE). */
    static final class Report {
        private final String nonce;
        private final ByteArrayOutputStream pending = new ByteArrayOutputStream();

        Report(String nonce) {
            this.nonce = nonce;
        }

        Report frame(String kind, String... fields) throws IOException {
            var line = new StringBuilder("\n").append(nonce).append(' ').append(kind);
            for (String field : fields) line.append(' ').append(field);
            byte[] data = line.append('\n').toString().getBytes(StandardCharsets.ISO_8859_1);
            if (pending.size() > 0 && pending.size() + data.length > VerlHyperlightProtocol.CONSOLE_WRITE) {
                flush();
            }
            pending.write(data);
            return this;
        }

        void flush() throws IOException {
            if (pending.size() == 0) return;
            CONSOLE.write(pending.toByteArray());
            pending.reset();
        }
    }

    static void frames(String nonce, String... kinds) {
        try {
            var report = new Report(nonce);
            for (String kind : kinds) report.frame(kind);
            report.flush();
        } catch (IOException e) {
            Runtime.getRuntime().halt(VerlHyperlightProtocol.REPORT_FAILED_STATUS);
        }
    }

    /** One case: its output, kept in the guest's memory as a file would keep it, and its end,
     *  reported once. */
    static final class Case {
        final String nonce;
        final ByteArrayOutputStream[] outputs = {new ByteArrayOutputStream(), new ByteArrayOutputStream()};
        final List<String> fetch = new ArrayList<>();
        String limitHit;
        long started;
        boolean reported;
        volatile int exitStatus = -1;

        Case(String nonce) {
            this.nonce = nonce;
        }

        synchronized void write(int stream, byte[] data, int offset, int length) {
            if (reported) return;
            var output = outputs[stream];
            output.write(data, offset, length);
            if (output.size() > VerlHyperlightProtocol.OUTPUT_LIMIT) {
                // As a process past its file-size limit: stopped there, with SIGXFSZ's status.
                // The JVM ends with it: nothing the program catches goes on.
                limitHit = stream == 0 ? "stdout" : "stderr";
                finish(VerlHyperlightProtocol.OUTPUT_LIMIT_STATUS, true);
                Runtime.getRuntime().halt(VerlHyperlightProtocol.OUTPUT_LIMIT_STATUS);
            }
        }

        /** Report the program's end and copy its output out: once, whatever calls it next.
         *  `last`: the guest ends once it is reported. */
        synchronized void finish(int status, boolean last) {
            if (reported) return;
            reported = true;
            double elapsed = (System.nanoTime() - started) / 1e9;
            try {
                if (limitHit != null) status = VerlHyperlightProtocol.OUTPUT_LIMIT_STATUS;
                byte[][] kept = new byte[2][];
                for (int i = 0; i < 2; i++) {
                    byte[] all = outputs[i].toByteArray();
                    kept[i] = all.length > VerlHyperlightProtocol.OUTPUT_LIMIT
                            ? java.util.Arrays.copyOf(all, VerlHyperlightProtocol.OUTPUT_LIMIT)
                            : all;
                }
                List<byte[]> files = new ArrayList<>();
                var sizes = new StringBuilder();
                fetched(files, sizes);
                var report = new Report(nonce);
                report.frame(VerlHyperlightProtocol.END, String.valueOf(status),
                        String.format(Locale.ROOT, "%.6f", elapsed), limitHit == null ? "-" : limitHit,
                        String.valueOf(kept[0].length), String.valueOf(kept[1].length),
                        sizes.length() == 0 ? "-" : sizes.toString());
                copyOut(report, "stdout", kept[0]);
                copyOut(report, "stderr", kept[1]);
                for (int i = 0; i < files.size(); i++) {
                    if (files.get(i) != null) copyOut(report, VerlHyperlightProtocol.FILE + " " + i, files.get(i));
                }
                if (last) report.frame(VerlHyperlightProtocol.DONE, VerlHyperlightProtocol.LAST);
                else report.frame(VerlHyperlightProtocol.DONE);
                report.flush();
            } catch (Throwable e) {
                // The program broke what the report needs: the guest ends, and the host answers
                // the run as its failure.
                Runtime.getRuntime().halt(VerlHyperlightProtocol.REPORT_FAILED_STATUS);
            }
        }

        private void fetched(List<byte[]> files, StringBuilder sizes) {
            long total = 0;
            for (String name : fetch) {
                byte[] data = null;
                long size = VerlHyperlightProtocol.FILE_MISSING;
                try {
                    var where = new File(WORK_DIR, name);
                    if (where.isFile()) {
                        data = Files.readAllBytes(where.toPath());
                        size = data.length;
                    }
                } catch (IOException | RuntimeException | OutOfMemoryError e) {
                    data = null; // missing, or not readable: FILE_MISSING
                    size = VerlHyperlightProtocol.FILE_MISSING;
                }
                if (size >= 0 && total + size > VerlHyperlightProtocol.FILES_OUT_LIMIT) {
                    total = VerlHyperlightProtocol.FILES_OUT_LIMIT + 1; // this one and every later one
                    size = VerlHyperlightProtocol.FILE_LEFT_OUT;
                    data = null;
                }
                total += Math.max(size, 0);
                files.add(data);
                if (sizes.length() > 0) sizes.append(',');
                sizes.append(size);
            }
        }

        private static void copyOut(Report report, String kind, byte[] data) throws IOException {
            for (int offset = 0; offset < data.length; offset += VerlHyperlightProtocol.CHUNK) {
                int end = Math.min(data.length, offset + VerlHyperlightProtocol.CHUNK);
                byte[] chunk = java.util.Arrays.copyOfRange(data, offset, end);
                report.frame(kind, Base64.getEncoder().encodeToString(chunk));
            }
        }
    }

    /** A stream of the program's: stdout (0) or stderr (1), kept by the case. */
    static final class CaseStream extends OutputStream {
        private final Case kase;
        private final int stream;

        CaseStream(Case kase, int stream) {
            this.kase = kase;
            this.stream = stream;
        }

        @Override
        public void write(int b) {
            kase.write(stream, new byte[] {(byte) b}, 0, 1);
        }

        @Override
        public void write(byte[] data, int offset, int length) {
            kase.write(stream, data, offset, length);
        }
    }

    /** The request's files, written where the service writes them (the program's working
     *  directory); why one cannot be, if so. */
    static String writeRequestFiles(Case kase, String caseDir) {
        var manifestPath = new File(caseDir, VerlHyperlightProtocol.FILES);
        if (!manifestPath.exists()) return null;
        Object manifest;
        try {
            manifest = new Json(Files.readString(manifestPath.toPath())).value();
        } catch (IOException | RuntimeException e) {
            return "cannot read the request's files: " + e;
        }
        var fields = (java.util.Map<?, ?>) manifest;
        for (Object name : (List<?>) fields.get("fetch")) kase.fetch.add((String) name);
        for (Object entry : (List<?>) fields.get("write")) {
            var pair = (List<?>) entry;
            String name = (String) pair.get(0);
            long index = ((Number) pair.get(1)).longValue();
            try {
                var target = new File(WORK_DIR, name);
                var parent = target.getParentFile();
                if (parent != null) parent.mkdirs();
                Files.write(target.toPath(),
                        Files.readAllBytes(new File(caseDir, VerlHyperlightProtocol.FILE_PREFIX + index).toPath()));
            } catch (IOException | RuntimeException e) {
                return "cannot write the request's file \"" + name + "\": " + e.getMessage();
            }
        }
        return null;
    }

    /** The little JSON the manifest is: objects, arrays, strings and integers. */
    static final class Json {
        private final String text;
        private int at;

        Json(String text) {
            this.text = text;
        }

        Object value() {
            skip();
            char c = text.charAt(at);
            if (c == '{') {
                var map = new java.util.HashMap<String, Object>();
                at++;
                skip();
                if (text.charAt(at) == '}') {
                    at++;
                    return map;
                }
                while (true) {
                    skip();
                    String key = (String) value();
                    skip();
                    expect(':');
                    map.put(key, value());
                    skip();
                    if (text.charAt(at++) == '}') return map;
                }
            }
            if (c == '[') {
                var list = new ArrayList<Object>();
                at++;
                skip();
                if (text.charAt(at) == ']') {
                    at++;
                    return list;
                }
                while (true) {
                    list.add(value());
                    skip();
                    if (text.charAt(at++) == ']') return list;
                }
            }
            if (c == '"') return string();
            int start = at;
            while (at < text.length() && "-0123456789".indexOf(text.charAt(at)) >= 0) at++;
            return Long.parseLong(text.substring(start, at));
        }

        private String string() {
            expect('"');
            var out = new StringBuilder();
            while (true) {
                char c = text.charAt(at++);
                if (c == '"') return out.toString();
                if (c != '\\') {
                    out.append(c);
                    continue;
                }
                char e = text.charAt(at++);
                switch (e) {
                    case 'n' -> out.append('\n');
                    case 't' -> out.append('\t');
                    case 'r' -> out.append('\r');
                    case 'b' -> out.append('\b');
                    case 'f' -> out.append('\f');
                    case 'u' -> {
                        out.append((char) Integer.parseInt(text.substring(at, at + 4), 16));
                        at += 4;
                    }
                    default -> out.append(e);
                }
            }
        }

        private void expect(char c) {
            if (text.charAt(at++) != c) throw new IllegalArgumentException("expected " + c + " at " + (at - 1));
        }

        private void skip() {
            while (at < text.length() && Character.isWhitespace(text.charAt(at))) at++;
        }
    }

    /** The class path `java -cp .:<the request's jars>` gives, with the program's jar first. */
    static URL[] classPath(String caseDir) throws IOException {
        var urls = new ArrayList<URL>();
        urls.add(new File(caseDir, VerlHyperlightProtocol.PROGRAM).toURI().toURL());
        urls.add(new File(WORK_DIR).toURI().toURL());
        File[] jars = new File(WORK_DIR).listFiles((dir, name) -> name.endsWith(".jar"));
        if (jars != null) {
            java.util.Arrays.sort(jars);
            for (File jar : jars) urls.add(jar.toURI().toURL());
        }
        return urls.toArray(new URL[0]);
    }

    /** Run Main's main as the launcher would: true when it returned, false when it could not
     *  run or threw (printed as the JVM prints an uncaught exception). */
    static boolean launch(ClassLoader loader) {
        Class<?> main;
        try {
            main = Class.forName("Main", false, loader);
        } catch (ClassNotFoundException | LinkageError e) {
            System.err.println(NOT_FOUND);
            System.err.println("Caused by: " + e);
            return false;
        }
        Method method;
        try {
            method = main.getMethod("main", String[].class);
        } catch (NoSuchMethodException | LinkageError e) {
            method = null;
        }
        if (method == null || method.getReturnType() != void.class) {
            System.err.println(NO_MAIN);
            return false;
        }
        if (!Modifier.isStatic(method.getModifiers())) {
            System.err.println(NOT_STATIC);
            return false;
        }
        try {
            method.invoke(null, (Object) new String[0]);
            return true;
        } catch (InvocationTargetException e) {
            uncaught(e.getCause());
        } catch (Throwable e) {
            uncaught(e); // Main's static initializer (ExceptionInInitializerError)
        }
        return false;
    }

    /** What the JVM does with an exception nothing caught on its main thread: the thread's
     *  handler (the program's own, if it set one) or its group's, which prints
     *  `Exception in thread "main" ...` to System.err; the frames of the runner cut off. */
    static void uncaught(Throwable error) {
        trim(error, new HashSet<>());
        Thread thread = Thread.currentThread();
        thread.getUncaughtExceptionHandler().uncaughtException(thread, error);
    }

    /** `error`'s stack (and its causes' and suppressed ones') without the runner's frames and
     *  the JDK's above them (the reflection that called Main.main, the initialization of
     *  Main): as deep as the launcher's stack shows, whose call of main is the JVM's own. */
    static void trim(Throwable error, Set<Throwable> seen) {
        if (error == null || !seen.add(error)) return;
        StackTraceElement[] stack = error.getStackTrace();
        int cut = -1;
        for (int i = 0; i < stack.length; i++) {
            if (stack[i].getClassName().contains("VerlHyperlightRunner")) {
                cut = i;
                break;
            }
        }
        if (cut >= 0) {
            while (cut > 0 && isJdk(stack[cut - 1].getClassName())) cut--;
            error.setStackTrace(java.util.Arrays.copyOf(stack, cut));
        }
        trim(error.getCause(), seen);
        for (Throwable suppressed : error.getSuppressed()) trim(suppressed, seen);
    }

    static boolean isJdk(String className) {
        return className.startsWith("java.") || className.startsWith("jdk.") || className.startsWith("sun.");
    }

    /** Wait for the threads the program started that are not daemons, as the JVM does before
     *  it exits. */
    static void joinThreads(Set<Thread> before) throws InterruptedException {
        while (true) {
            Thread waitFor = null;
            for (Thread thread : Thread.getAllStackTraces().keySet()) {
                if (!before.contains(thread) && thread.isAlive() && !thread.isDaemon()
                        && thread != Thread.currentThread()) {
                    waitFor = thread;
                    break;
                }
            }
            if (waitFor == null) return;
            waitFor.join();
        }
    }

    /** Run the case mounted at `caseDir` and report it under `nonce`. */
    static void runCase(String caseDir, String nonce) throws Exception {
        var kase = new Case(nonce);
        new File(WORK_DIR).mkdirs();
        String refusal = writeRequestFiles(kase, caseDir);
        if (refusal != null) {
            new Report(nonce).frame(VerlHyperlightProtocol.REFUSED,
                    Base64.getEncoder().encodeToString(refusal.getBytes(StandardCharsets.UTF_8))).flush();
            return;
        }
        byte[] input = Files.readAllBytes(new File(caseDir, VerlHyperlightProtocol.STDIN).toPath());
        chdir(WORK_DIR);
        var loader = new URLClassLoader(classPath(caseDir), ClassLoader.getPlatformClassLoader());
        loader.setDefaultAssertionStatus(true); // -ea
        InputStream in = System.in;
        PrintStream out = System.out;
        PrintStream err = System.err;
        Set<Thread> before = new HashSet<>(Thread.getAllStackTraces().keySet());
        // System.exit ends the JVM: its hook reports the case with the status it logged.
        Thread hook = new Thread(() -> {
            Case exiting = current;
            if (exiting != null) exiting.finish(exiting.exitStatus >= 0 ? exiting.exitStatus : 1, true);
        }, "verl-hyperlight-report");
        Runtime.getRuntime().addShutdownHook(hook);
        current = kase;
        System.setIn(new ByteArrayInputStream(input));
        System.setOut(new PrintStream(new CaseStream(kase, 0), true, StandardCharsets.UTF_8));
        System.setErr(new PrintStream(new CaseStream(kase, 1), true, StandardCharsets.UTF_8));
        boolean[] returned = {false};
        Thread main = new Thread(() -> returned[0] = launch(loader), "main");
        main.setContextClassLoader(loader);
        new Report(nonce).frame(VerlHyperlightProtocol.START).flush();
        kase.started = System.nanoTime();
        main.start();
        main.join();
        joinThreads(before);
        kase.finish(returned[0] ? 0 : 1, false);
        current = null;
        try {
            Runtime.getRuntime().removeShutdownHook(hook);
        } catch (IllegalStateException e) {
            // the JVM is exiting: the hook has reported already
        }
        System.setIn(in);
        System.setOut(out);
        System.setErr(err);
    }

    /** A ready guest's workload: wait for the host's GO line on the console's input, then run
     *  the case as runCase does; input that ends before it ends the guest with no report. Raw
     *  reads: a buffered stream asks available() of the console, which the guest's fails. */
    static void awaitCase(String caseDir, String nonce) throws Exception {
        var console = new FileInputStream(FileDescriptor.in);
        var line = new ByteArrayOutputStream();
        byte[] buffer = new byte[4096];
        while (line.toString(StandardCharsets.ISO_8859_1).indexOf('\n') < 0) {
            int count;
            try {
                count = console.read(buffer);
            } catch (IOException e) {
                // A console made non-blocking: wait a millisecond (the vCPU halts), and read again.
                if (!String.valueOf(e.getMessage()).contains("temporarily unavailable")) throw e;
                Thread.sleep(1);
                continue;
            }
            if (count < 0) return;
            line.write(buffer, 0, count);
        }
        String text = line.toString(StandardCharsets.ISO_8859_1);
        if (!text.substring(0, text.indexOf('\n')).trim().equals(VerlHyperlightProtocol.GO)) return;
        runCase(caseDir, nonce);
    }

    /** The warm-up's workload: report an empty case. */
    static void probe(String nonce) {
        frames(nonce, VerlHyperlightProtocol.START,
                VerlHyperlightProtocol.END + " 0 0.000000 - 0 0 -", VerlHyperlightProtocol.DONE);
    }

    /** Before the warm snapshot: load what every case uses (this class, its logger, a class
     *  loader, the formats), so that a restored guest only loads the program. */
    static void prepare() throws Exception {
        new Json("{\"write\": [[\"a\", 0]], \"fetch\": [\"b\"]}").value();
        Base64.getEncoder().encodeToString(String.format(Locale.ROOT, "%.6f", 0.5).getBytes(StandardCharsets.UTF_8));
        new URLClassLoader(new URL[] {new File(WORK_DIR).toURI().toURL()}, ClassLoader.getPlatformClassLoader()).close();
        new PrintStream(OutputStream.nullOutputStream(), true, StandardCharsets.UTF_8).println(0.5);
    }
}
