// The stand-in's java driver: what hluk's java image does inside the micro-VM.
//
// hyperlight-unikraft's drivers/java (hl_javadriver.c, HlJavaDispatch's Dispatch.java and
// Snippets.java, jvm.args, Dockerfile) boots one JVM (a jlinked Temurin 25) at the guest's
// start and runs each call's code in it with JShell, in the same JVM. What is reproduced here,
// and nothing kinder:
// - every snippet is compiled with the preamble `import module java.base;` (Snippets.PREAMBLE;
//   its `import hyperlight.*` names the image's own package, which nothing here uses);
// - a call's code is split into snippets (analyzeCompletion) and evaluated in order:
//   declarations stay for later calls, statements and expressions are dropped once run;
// - a call made of declarations alone runs the `main` it declared, as `java Hello.java` would
//   (a top-level main first, then the first class declaring one); a call with any statement
//   never runs one;
// - a snippet that does not compile prints `error: ` and javac's message, one that throws
//   prints `Exception in thread "main" ...`; either fails the call with status 1, and the JVM
//   lives on;
// - System.exit(n) ends the JVM, and the call's status is n (hl_javadriver.c: the driver reaps
//   the JVM and returns its status): the stand-in hluk reads it from the JVM's own end;
// - the warm-exec is a call of its own, before the code's, in the same JVM; a call that fails
//   prints `hl_driver: dispatch callback failed` (drivers/hl_driver.h), and its status is hluk's;
// - the JVM's options are jvm.args' (no -ea anywhere), its modules the image's jlink list, its
//   manifest's Add-Opens the image jar's; the stand-in (tests/standin/hluk) starts it so.
// What it cannot copy: the image's CDS archive and restore timings, musl, Unikraft's pipes.
// The stand-in passes the status descriptor, the code and the warm-exec as arguments.

import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.regex.Pattern;

import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.MethodSnippet;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis.Completeness;
import jdk.jshell.TypeDeclSnippet;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.execution.DirectExecutionControl;
import jdk.jshell.execution.LoaderDelegate;
import jdk.jshell.spi.ExecutionControl;
import jdk.jshell.spi.ExecutionControl.ClassBytecodes;
import jdk.jshell.spi.ExecutionControl.ClassInstallException;
import jdk.jshell.spi.ExecutionControlProvider;
import jdk.jshell.spi.ExecutionEnv;

public final class JavaDriver {
    private static final String PREAMBLE = "import module java.base;\n";
    private static final String CALL_FAILED = "hl_driver: dispatch callback failed\n";
    private static final Pattern MAIN = Pattern.compile("\\bvoid\\s+main\\s*\\(");

    private JavaDriver() {}

    public static void main(String[] args) throws Exception {
        var status = new FileOutputStream(fd(Integer.parseInt(args[0])));
        String code = args[1];
        String warmExec = args.length > 2 ? args[2] : null;
        // In this JVM, on the calling thread, classes defined as they are (the image's
        // Snippets.Engine: a DirectExecutionControl over a loader of its own).
        var engine = new ExecutionControlProvider() {
            @Override
            public String name() {
                return "standin";
            }

            @Override
            public ExecutionControl generate(ExecutionEnv env, Map<String, String> parameters) {
                return new DirectExecutionControl(new Loader());
            }
        };
        var js = JShell.builder().executionEngine(engine, Map.of()).build();
        if (run(js, PREAMBLE) != 0) throw new IllegalStateException("the preamble did not compile");
        int result = warmExec == null ? 0 : run(js, warmExec);
        if (result == 0) result = run(js, code);
        System.out.flush();
        System.err.flush();
        if (result != 0) {
            System.err.print(CALL_FAILED);
            System.err.flush();
        }
        status.write((result + "\n").getBytes(StandardCharsets.US_ASCII));
        status.flush();
        // The guest ends with its call: threads the code left running end with it.
        Runtime.getRuntime().halt(result);
    }

    /** Run `code`: 0 when it ran to its end, 1 when it did not compile or threw. */
    static int run(JShell js, String code) {
        boolean statements = false;
        var mains = new ArrayList<String>();
        String rest = code;
        while (!rest.isBlank()) {
            var info = js.sourceCodeAnalysis().analyzeCompletion(rest);
            if (info.completeness() == Completeness.EMPTY) break;
            String source = info.completeness().isComplete() ? info.source() : rest;
            rest = info.completeness().isComplete() ? info.remaining() : "";
            for (SnippetEvent event : js.eval(source)) {
                if (event.causeSnippet() != null) continue;
                Snippet snippet = event.snippet();
                if (event.status() == Snippet.Status.REJECTED) {
                    for (Diag diag : js.diagnostics(snippet).toList()) {
                        System.err.println("error: " + diag.getMessage(null));
                    }
                    return 1;
                }
                if (event.exception() != null) {
                    report(event.exception());
                    return 1;
                }
                boolean ran = snippet.kind() == Snippet.Kind.STATEMENT
                        || snippet.kind() == Snippet.Kind.EXPRESSION
                        || snippet.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND;
                statements |= ran;
                if (ran) js.drop(snippet);
                if (snippet instanceof MethodSnippet method && method.name().equals("main")) {
                    mains.add(0, "main(new String[0]);");
                } else if (snippet instanceof TypeDeclSnippet type && MAIN.matcher(type.source()).find()) {
                    mains.add(type.name() + ".main(new String[0]);");
                }
            }
        }
        if (statements || mains.isEmpty()) return 0;
        // Declarations alone: their main runs, as `java Hello.java` runs it.
        for (SnippetEvent event : js.eval(mains.get(0))) {
            if (event.status() == Snippet.Status.REJECTED) {
                for (Diag diag : js.diagnostics(event.snippet()).toList()) {
                    System.err.println("error: " + diag.getMessage(null));
                }
                return 1;
            }
            if (event.exception() != null) {
                report(event.exception());
                return 1;
            }
            js.drop(event.snippet());
        }
        return 0;
    }

    private static void report(Exception exception) {
        String name = exception instanceof EvalException eval ? eval.getExceptionClassName()
                : exception instanceof UnresolvedReferenceException ? "java.lang.IllegalStateException"
                : exception.getClass().getName();
        String message = exception.getMessage();
        System.err.println("Exception in thread \"main\" " + name + (message == null ? "" : ": " + message));
        for (StackTraceElement frame : exception.getStackTrace()) {
            System.err.println("\tat " + frame);
        }
    }

    /** The snippets' classes, defined from JShell's bytes as they are asked for. */
    static final class Loader extends ClassLoader implements LoaderDelegate {
        private final Map<String, byte[]> classes = new ConcurrentHashMap<>();

        Loader() {
            super(JavaDriver.class.getClassLoader());
        }

        @Override
        public void load(ClassBytecodes[] bytecodes) throws ClassInstallException {
            boolean[] installed = new boolean[bytecodes.length];
            for (ClassBytecodes c : bytecodes) classes.put(c.name(), c.bytecodes());
            for (int i = 0; i < bytecodes.length; i++) {
                try {
                    findClass(bytecodes[i].name());
                    installed[i] = true;
                } catch (ClassNotFoundException | LinkageError e) {
                    throw new ClassInstallException("cannot load " + bytecodes[i].name() + ": " + e, installed);
                }
            }
        }

        @Override
        public void classesRedefined(ClassBytecodes[] bytecodes) {
            for (ClassBytecodes c : bytecodes) classes.put(c.name(), c.bytecodes());
        }

        @Override
        public void addToClasspath(String path) {
            throw new UnsupportedOperationException("no class path but the image's");
        }

        @Override
        public synchronized Class<?> findClass(String name) throws ClassNotFoundException {
            Class<?> loaded = findLoadedClass(name);
            if (loaded != null) return loaded;
            byte[] bytes = classes.get(name);
            if (bytes == null) throw new ClassNotFoundException(name);
            return defineClass(name, bytes, 0, bytes.length);
        }
    }

    /** A FileDescriptor for an inherited descriptor (java.io opened by the manifest). */
    private static FileDescriptor fd(int n) throws ReflectiveOperationException {
        var descriptor = new FileDescriptor();
        Field field = FileDescriptor.class.getDeclaredField("fd");
        field.setAccessible(true);
        field.setInt(descriptor, n);
        return descriptor;
    }
}
