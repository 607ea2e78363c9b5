// Apache Iceberg's own REST catalog (RESTCatalogAdapter + RESTCatalogServlet from iceberg-core's test
// jar, the code behind the apache/iceberg-rest-fixture image) on Jetty, bound to ONE address.
//
// Run with Java 17's single-file source launch, so the project ships no build step and no jar of its own:
//   java -cp "<the iceberg-rest jar set>/*" RestCatalogLauncher.java
// (fanout_sink/devtools/stack/rest_catalog.py does exactly that).
//
// Settings come from the environment, as the fixture reads them, so secrets stay off the command line:
// every CATALOG_X variable becomes catalog property x (CATALOG_ dropped, "__" -> "-", "_" -> ".", lower
// case), e.g. CATALOG_URI -> uri, CATALOG_JDBC_PASSWORD -> jdbc.password, CATALOG_S3_ENDPOINT ->
// s3.endpoint. Defaults as in the fixture: catalog-impl JdbcCatalog, jdbc.schema-version V1. Two are
// the launcher's own and never reach the catalog: rest.host (default 127.0.0.1; the fixture binds every
// interface and has no setting) and rest.port (default 8181). uri and warehouse are required: an
// in-memory database would lose every table at a restart.
//
// Logging goes through java.util.logging, one line per record on stderr. The servlet logs every 4xx
// answer (a missing table, a commit conflict) as an ERROR with a stack trace; those are the client's
// business and are dropped here, 5xx answers keep theirs.

import java.lang.management.ManagementFactory;
import java.net.InetSocketAddress;
import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogManager;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import java.util.logging.StreamHandler;
import java.util.logging.SimpleFormatter;
import java.util.regex.Pattern;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.rest.RESTCatalogAdapter;
import org.apache.iceberg.rest.RESTCatalogServlet;
import org.eclipse.jetty.ee10.servlet.ServletContextHandler;
import org.eclipse.jetty.ee10.servlet.ServletHolder;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;

public final class RestCatalogLauncher {
  private static final String PREFIX = "CATALOG_";
  private static final String HOST = "rest.host";
  private static final String PORT = "rest.port";
  private static final Set<String> REQUIRED = Set.of("uri", "warehouse");
  private static final Set<String> SECRET_WORDS = Set.of("password", "secret", "token", "credential");
  /** What the servlet's log record carries for an error answer the adapter already sent. */
  private static final Pattern CLIENT_ERROR = Pattern.compile("Unhandled error: ErrorResponse\\(code=4\\d\\d\\b");

  private RestCatalogLauncher() {}

  public static void main(String[] args) throws Exception {
    configureLogging();
    Logger log = Logger.getLogger(RestCatalogLauncher.class.getName());
    Map<String, String> properties = catalogProperties(System.getenv());
    for (String key : REQUIRED) {
      if (!properties.containsKey(key)) {
        String variable = PREFIX + key.toUpperCase(Locale.ROOT);
        System.err.println(
            "error: the catalog property " + key + " is not set; set the environment variable " + variable);
        System.exit(2);
      }
    }
    String host = properties.remove(HOST);
    String port = properties.remove(PORT);
    InetSocketAddress address =
        new InetSocketAddress(host == null ? "127.0.0.1" : host, port == null ? 8181 : Integer.parseInt(port));

    Catalog catalog = CatalogUtil.buildIcebergCatalog("rest_backend", properties, new Configuration());
    ServletContextHandler context = new ServletContextHandler();
    context.addServlet(new ServletHolder(new RESTCatalogServlet(new RESTCatalogAdapter(catalog))), "/*");
    Server server = new Server();
    ServerConnector connector = new ServerConnector(server);
    connector.setHost(address.getHostString());
    connector.setPort(address.getPort());
    server.addConnector(connector);
    server.setHandler(context);
    server.setStopAtShutdown(true); // SIGTERM: Jetty stops, then the catalog's JDBC pool closes below
    Runtime.getRuntime()
        .addShutdownHook(new Thread(() -> closeQuietly(catalog), "close-catalog"));
    server.start();
    long startedMs = System.currentTimeMillis() - ManagementFactory.getRuntimeMXBean().getStartTime();
    log.info(
        String.format(
            "serving the Iceberg REST catalog on http://%s:%d (%s at %s, warehouse %s) %d ms after the JVM started",
            address.getHostString(), connector.getLocalPort(), properties.get("catalog-impl"),
            redactedUri(properties.get("uri")), properties.get("warehouse"), startedMs));
    log.info("catalog properties: " + redacted(properties));
    server.join();
  }

  /** The fixture's convention: CATALOG_X -> x, with its defaults for what is not set. */
  static Map<String, String> catalogProperties(Map<String, String> env) {
    Map<String, String> properties = new HashMap<>();
    env.forEach(
        (name, value) -> {
          if (name.startsWith(PREFIX) && name.length() > PREFIX.length()) {
            String key =
                name.substring(PREFIX.length())
                    .replace("__", "-")
                    .replace("_", ".")
                    .toLowerCase(Locale.ROOT);
            properties.put(key, value);
          }
        });
    properties.putIfAbsent("catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog");
    properties.putIfAbsent("jdbc.schema-version", "V1");
    return properties;
  }

  private static Map<String, String> redacted(Map<String, String> properties) {
    Map<String, String> shown = new TreeMap<>();
    properties.forEach(
        (key, value) -> {
          boolean secret = SECRET_WORDS.stream().anyMatch(word -> key.contains(word));
          shown.put(key, secret ? "***" : key.equals("uri") ? redactedUri(value) : value);
        });
    return shown;
  }

  /** A JDBC URI without the query string, where drivers accept user=...&password=... */
  private static String redactedUri(String uri) {
    if (uri == null) {
      return null;
    }
    int query = uri.indexOf('?');
    return query < 0 ? uri : uri.substring(0, query) + "?***";
  }

  private static void closeQuietly(Catalog catalog) {
    if (catalog instanceof AutoCloseable closeable) {
      try {
        closeable.close();
      } catch (Exception e) {
        Logger.getLogger(RestCatalogLauncher.class.getName())
            .log(Level.WARNING, "closing the catalog failed", e);
      }
    }
  }

  /** One line per record on stderr, INFO and up, the servlet's 4xx records dropped. */
  private static void configureLogging() {
    System.setProperty(
        "java.util.logging.SimpleFormatter.format", "%1$tF %1$tT %4$s %3$s: %5$s%6$s%n");
    LogManager.getLogManager().reset();
    Handler handler =
        new StreamHandler(System.err, new SimpleFormatter()) {
          @Override
          public synchronized void publish(LogRecord record) {
            super.publish(record);
            flush();
          }
        };
    handler.setLevel(Level.INFO);
    handler.setFilter(record -> !isClientError(record));
    Logger root = Logger.getLogger("");
    root.setLevel(Level.INFO);
    root.addHandler(handler);
  }

  private static boolean isClientError(LogRecord record) {
    Throwable thrown = record.getThrown();
    return thrown != null
        && RESTCatalogServlet.class.getName().equals(record.getLoggerName())
        && thrown.getMessage() != null
        && CLIENT_ERROR.matcher(thrown.getMessage()).find();
  }
}
