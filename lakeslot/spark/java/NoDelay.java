/*
 * py4j's replies not held back: Nagle's algorithm off on the JVM's end of every connection of
 * py4j's server, set once per JVM (lakeslot/spark/session.py's no_delay says why it matters).
 *
 * Built for cost: done from Python, it was three py4j calls per connection the server had, made
 * by every new Python thread (each has a connection of its own), and a connection that closed
 * meanwhile made an error whose translation cost PySpark failed class lookups through every jar
 * — a fifth of the driver JVM's samples in a pass of 200 tables on object storage. Here a
 * listener of the server sets each connection as it starts, and install sets those open already.
 *
 * Invariants: installed at most once per server (a second session in the same JVM finds it);
 * it changes nothing but the sockets' TCP_NODELAY.
 *
 * Failure modes: none raised by a connection: a socket that cannot be set (closed meanwhile)
 * keeps Nagle's algorithm, which only makes its replies slower.
 */
package lakeslot.py4j;

import java.lang.reflect.Field;
import java.net.Socket;
import java.net.SocketException;
import java.util.List;
import py4j.DefaultGatewayServerListener;
import py4j.GatewayServer;
import py4j.GatewayServerListener;
import py4j.Py4JServerConnection;

public final class NoDelay extends DefaultGatewayServerListener {
  private NoDelay() {}

  /**
   * Nagle's algorithm off on every connection of {@code server}, those it has and those it will
   * have; whether this call installed it (false: it already was).
   */
  public static boolean install(GatewayServer server) throws ReflectiveOperationException {
    synchronized (NoDelay.class) {
      for (GatewayServerListener listener : server.getListeners()) {
        if (listener instanceof NoDelay) {
          return false;
        }
      }
      server.addListener(new NoDelay());
    }
    Field field = GatewayServer.class.getDeclaredField("connections");
    field.setAccessible(true);
    Object[] open;
    try {
      open = ((List<?>) field.get(server)).toArray();
    } catch (RuntimeException e) { // (changed while copied: the listener has the new ones)
      return true;
    }
    for (Object connection : open) {
      if (connection instanceof Py4JServerConnection) {
        set(((Py4JServerConnection) connection).getSocket());
      }
    }
    return true;
  }

  @Override
  public void connectionStarted(Py4JServerConnection connection) {
    set(connection.getSocket());
  }

  private static void set(Socket socket) {
    try {
      if (socket != null && !socket.getTcpNoDelay()) {
        socket.setTcpNoDelay(true);
      }
    } catch (SocketException e) { // closed meanwhile: nothing to speed up
    }
  }
}
